"""An exact, per-rank account of the bytes a training step holds, by category.

On a GPU `torch.cuda.max_memory_allocated` gives one number; on CPU there is no allocator
to ask, and one number would not say *what* fills the memory anyway. The ledger is told
about every buffer the training code allocates (or counts it itself, for activations),
so it can report the ZeRO paper's breakdown (Rajbhandari et al., 2020, figure 1) exactly (the categories: `MemoryLedger`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from functools import partial

import torch

from impls.memory.saved import SavedStorages, storage_key

__all__ = ["CATEGORIES", "MemoryLedger"]

CATEGORIES = ("params", "grads", "optim", "gathered", "activations", "buffers")


class MemoryLedger:
    """Bytes held per category on this rank, with peaks.

    `device`: on CUDA, `snapshot()` also reports `torch.cuda.max_memory_allocated` beside
    the ledger's own numbers, and `reset_peak()` resets the allocator's peak too.

    - `params`, `grads`, `optim` (optimizer state, fp32 master weights included): model states;
    - `gathered`: the transient full parameters of a ZeRO-3 unit;
    - `activations`: tensors autograd saves for backward, counted by a `saved_tensors_hooks`
      pack hook (`impls.memory.saved`), each storage once, parameters and tracked buffers
      excluded, and released when autograd drops the saved tensor (a `weakref.finalize` on
      the packed handle);
    - `buffers`: communication buckets and other transient gradient buffers.

    Besides the current bytes it keeps the peak of the running total since `reset_peak()`,
    the breakdown at that peak, and each category's own peak.
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.current = dict.fromkeys(CATEGORIES, 0)
        self.peak = dict.fromkeys(CATEGORIES, 0)
        self.peak_total = 0
        self.at_peak = dict.fromkeys(CATEGORIES, 0)
        self._tracked: dict[int, tuple[str, int]] = {}  # storage data_ptr -> (category, bytes)
        self._saved = SavedStorages(
            on_count=partial(self.alloc, "activations"),
            on_release=partial(self.free, "activations"),
        )

    @property
    def total(self) -> int:
        return sum(self.current.values())

    def alloc(self, category: str, nbytes: int) -> None:
        """Count `nbytes` more held under `category`."""
        _check_category(category)
        if nbytes < 0:
            raise ValueError(f"nbytes={nbytes} must be >= 0")
        self.current[category] += nbytes
        self.peak[category] = max(self.peak[category], self.current[category])
        total = self.total
        if total > self.peak_total:
            self.peak_total = total
            self.at_peak = dict(self.current)

    def free(self, category: str, nbytes: int) -> None:
        """Count `nbytes` of `category` as released; more than is held is an error."""
        _check_category(category)
        if not 0 <= nbytes <= self.current[category]:
            raise ValueError(
                f"cannot free {nbytes} bytes of {category!r}: {self.current[category]} are held"
            )
        self.current[category] -= nbytes

    def track(self, category: str, tensor: torch.Tensor) -> torch.Tensor:
        """Count the storage under `tensor` (all of it, even for a view) until `untrack`.

        A tracked storage is also never counted as an activation when autograd saves it.
        Returns `tensor`, so allocation and tracking read as one line.
        """
        storage = tensor.untyped_storage()
        key, nbytes = storage.data_ptr(), storage.nbytes()
        if nbytes == 0:
            return tensor
        if key in self._tracked:
            raise ValueError(f"this storage is already tracked as {self._tracked[key][0]!r}")
        self.alloc(category, nbytes)
        self._tracked[key] = (category, nbytes)
        return tensor

    def untrack(self, tensor: torch.Tensor) -> None:
        """Release what `track` counted for this tensor's storage (before freeing it)."""
        storage = tensor.untyped_storage()
        if storage.nbytes() == 0:
            return
        entry = self._tracked.pop(storage.data_ptr(), None)
        if entry is None:
            raise ValueError("this storage is not tracked by the ledger")
        self.free(*entry)

    @contextlib.contextmanager
    def saved_activations(self, exclude: Iterable[torch.Tensor] = ()) -> Iterator[None]:
        """Count what autograd saves for backward inside the block under `activations`.

        Each storage is counted once however many saved tensors view it, and released when
        the last of them is dropped (normally by the backward that uses it). Parameters,
        tracked buffers and the storages of `exclude` (e.g. a plain model's parameters,
        whose transposed views autograd saves) are not activations and are skipped.
        """
        excluded = {storage_key(t) for t in exclude}
        with self._saved.counting(excluded, self._tracked):
            yield

    def reset_peak(self) -> None:
        """Start a new peak window (e.g. a step) from what is held now."""
        self.peak = dict(self.current)
        self.peak_total = self.total
        self.at_peak = dict(self.current)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def snapshot(self) -> dict:
        """Current bytes, peaks and the breakdown at the peak, as plain ints.

        Keys: `current` and `peak` (category -> bytes), `total`, `peak_total`, `at_peak`
        (category -> bytes when the total peaked); on CUDA also `cuda_max_allocated`.
        """
        snap = {
            "current": dict(self.current),
            "total": self.total,
            "peak": dict(self.peak),
            "peak_total": self.peak_total,
            "at_peak": dict(self.at_peak),
        }
        if self.device.type == "cuda":
            snap["cuda_max_allocated"] = torch.cuda.max_memory_allocated(self.device)
        return snap


def _check_category(category: str) -> None:
    if category not in CATEGORIES:
        raise ValueError(
            f"category={category!r} is unknown; allowed values: {', '.join(CATEGORIES)}"
        )
