"""The pure core: every decision about an answer, with no I/O (time and randomness passed in)."""
