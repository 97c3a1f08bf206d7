"""Gradient compression (issue 6, in progress): one interface (`Compressor`: compress to a
payload, decompress, optional error-feedback memory per tensor) and the sparsifiers and
quantizers of the lecture. Plugging them into the DDP gradient path, PowerSGD and DGC come
next.
"""

from impls.compression.base import Compressor, Payload, pack_bits, unpack_bits
from impls.compression.quantize import QSGD, Cast, OneBit, TernGrad, check_levels
from impls.compression.sparsify import RandomK, TopK, check_density, kept

__all__ = [
    "QSGD",
    "Cast",
    "Compressor",
    "OneBit",
    "Payload",
    "RandomK",
    "TernGrad",
    "TopK",
    "check_density",
    "check_levels",
    "kept",
    "pack_bits",
    "unpack_bits",
]
