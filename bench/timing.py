"""Legacy location of `slowest`: the measurement kit lives in `bench.kit`."""

from bench.kit.timing import slowest

__all__ = ["slowest"]
