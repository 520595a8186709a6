"""The I/O shell: streams, the client, shared state on a real Redis, against loopback servers."""
