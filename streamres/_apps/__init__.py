"""The applications: the command line and the benchmarks."""
