"""Benchmarks that ship with the package (``tianji-dask bench ...``); see docs/benchmarks.md."""
