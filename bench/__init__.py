"""Benchmarks and evaluations that drive the running service over HTTP."""
