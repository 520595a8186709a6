"""Helpers shared by the tests: streams, loopback servers, the SDKs' view of a stream."""
