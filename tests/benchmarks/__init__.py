"""The benchmarks' own tests (the only tests that import them)."""
