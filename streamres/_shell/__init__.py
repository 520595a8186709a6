"""The I/O shell: HTTP streams, sleeps, concurrency slots and the client object."""
