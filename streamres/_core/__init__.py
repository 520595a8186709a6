"""The pure core, the lowest floor: the vocabulary (events, errors, failure kinds) and the pure
pieces the floors above use — SSE decoding, classification, the policy after a failure, backoff,
de-duplication, the token ledger — with no I/O (time and randomness passed in)."""
