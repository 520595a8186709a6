"""Against what streamres did not write: recorded real streams, a real llama.cpp server, a real model, fuzzed servers."""
