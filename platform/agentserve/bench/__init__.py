"""Benchmarks that print and save measured figures (docs/benchmarks.md, docs/benchmarks/*.json)."""
