"""Measured memory: an exact per-rank account of parameters, gradients, optimizer state,
transient gathered parameters, saved activations and communication buffers, with peaks
(DESIGN.md, "Memory"). On CUDA, `torch.cuda.max_memory_allocated` is reported beside it.
"""

from impls.memory.ledger import CATEGORIES, MemoryLedger
from impls.memory.saved import SavedStorages, storage_key

__all__ = ["CATEGORIES", "MemoryLedger", "SavedStorages", "storage_key"]
