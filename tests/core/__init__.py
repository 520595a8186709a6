"""The pure floors: the core, the providers, the fleet and the answer machine, socket-free."""
