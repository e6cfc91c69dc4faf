"""Benchmarks: harness/ (shared tools), systems/ (what is measured), experiments/, report/."""
