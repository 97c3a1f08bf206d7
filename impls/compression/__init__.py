"""Gradient compression (issue 6, in progress): one interface (`Compressor`: compress to a
payload, decompress, optional error-feedback memory per tensor), the sparsifiers and
quantizers of the lecture, low-rank PowerSGD (Vogels et al. 2019) and Deep Gradient
Compression (Lin et al. 2018).
"""

from impls.compression.base import Compressor, Payload, pack_bits, unpack_bits
from impls.compression.dgc import DGC
from impls.compression.powersgd import PowerSGD, check_rank
from impls.compression.quantize import QSGD, Cast, OneBit, TernGrad, check_levels
from impls.compression.sparsify import RandomK, TopK, check_density, kept

__all__ = [
    "DGC",
    "QSGD",
    "Cast",
    "Compressor",
    "OneBit",
    "Payload",
    "PowerSGD",
    "RandomK",
    "TernGrad",
    "TopK",
    "check_density",
    "check_levels",
    "check_rank",
    "kept",
    "pack_bits",
    "unpack_bits",
]
