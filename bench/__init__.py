"""Benchmarks of localcluster, each runnable as `python -m bench.<name>` (see bench/README.md)."""
