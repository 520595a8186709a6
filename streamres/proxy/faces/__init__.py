"""The proxy's faces: each API's requests read into one call, and answers written back in
the client's own API (its events, bodies, errors and token counts). Pure."""
