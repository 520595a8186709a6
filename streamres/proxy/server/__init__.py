"""The proxy as a server: the ASGI application, who is let in (client keys, private mode),
the connections, the pages, and running it under uvicorn or hypercorn."""
