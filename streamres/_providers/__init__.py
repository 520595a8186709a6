"""The providers: each API's requests and stream events, to and from one event type."""
