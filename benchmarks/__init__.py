"""Reproducible benchmarks of qag; each prints its own command line and compares side by side in one run."""
