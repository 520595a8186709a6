"""What users meet: the command line, the chat, the proxy, the public API, the package as installed."""
