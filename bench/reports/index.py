"""Legacy location of the index writer: see `bench.report.index`."""

from bench.report.index import write_index

__all__ = ["write_index"]
