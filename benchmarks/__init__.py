"""Benchmarks that need more than the product installs (each brings its own environments)."""
