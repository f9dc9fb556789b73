"""The communication benchmark that ``python benchmarks/comm.py`` runs; see docs/benchmarks.md."""
