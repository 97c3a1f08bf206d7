"""The bytes autograd saves for backward: each storage once, parameters and given storages
excluded. `MemoryLedger.saved_activations` and the pipeline executor's activation peak both
count through `SavedStorages`, so the two figures mean the same thing.

Autograd hands every tensor it saves to a `saved_tensors_hooks` pack hook. Several saved
tensors often view one storage (a ReLU's output is saved again as the next linear's
input; a transposed weight views the parameter), so the count is by storage, not by
tensor, and a storage that is held whatever the step does (parameters, the caller's
batch, a buffer tracked elsewhere) is not an activation at all.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Container, Iterator

import torch
from torch import nn

__all__ = ["SavedStorages", "storage_key"]


def storage_key(tensor: torch.Tensor) -> int:
    """The key `SavedStorages` knows a storage by: the address of the storage that holds
    `tensor`'s bytes on this rank (for a DTensor, what autograd saves inside torch's
    tensor-parallel layers, that of its local shard)."""
    return _local_storage(tensor).data_ptr()


class _SavedActivation:
    """What the pack hook hands autograd instead of the tensor: when autograd drops it, a
    finalizer tells the count that one saved tensor on its storage is gone."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class SavedStorages:
    """A running count of the storages autograd saved inside `counting()` blocks.

    A storage is counted once however many saved tensors view it, across every block of
    this object. `nbytes` is the sum over the storages counted now; `on_count(nbytes)` and
    `on_release(nbytes)` are called when a storage enters and leaves the count.
    """

    def __init__(
        self,
        on_count: Callable[[int], None] | None = None,
        on_release: Callable[[int], None] | None = None,
    ) -> None:
        self.nbytes = 0
        self._on_count, self._on_release = on_count, on_release
        self._held: dict[int, list[int]] = {}  # storage key -> [saved tensors on it, bytes]

    @contextlib.contextmanager
    def counting(self, *excluded: Container[int], until_dropped: bool = True) -> Iterator[None]:
        """Count what autograd saves for backward inside the block.

        A saved tensor is skipped when it is a parameter, views an empty storage, or views
        a storage whose `storage_key` is in one of `excluded` (read at each save, so a dict
        that changes meanwhile works). `until_dropped`: a storage leaves the count when
        autograd drops the last saved tensor on it (normally in the backward that uses
        it). False: it stays counted for this object's life, with no finalizer per saved
        tensor, for an owner that frees the bytes on its own schedule.
        """

        def pack(tensor: torch.Tensor) -> torch.Tensor | _SavedActivation:
            key = self._count(tensor, excluded)
            if key is None or not until_dropped:
                return tensor
            handle = _SavedActivation(tensor)
            weakref.finalize(handle, self._release, key).atexit = False
            return handle

        with torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
            yield

    def _count(self, tensor: torch.Tensor, excluded: tuple[Container[int], ...]) -> int | None:
        """Count one more saved tensor on `tensor`'s storage; its key, or None when the
        storage is not an activation."""
        # Parameter's isinstance is a metaclass check costing more than the rest of the
        # count; a tensor of exact type torch.Tensor is never a parameter.
        if type(tensor) is not torch.Tensor and isinstance(tensor, nn.Parameter):
            return None
        storage = _local_storage(tensor)
        key, nbytes = storage.data_ptr(), storage.nbytes()
        if nbytes == 0:
            return None
        for keys in excluded:
            if key in keys:
                return None
        if key in self._held:
            self._held[key][0] += 1
            return key
        self._held[key] = [1, nbytes]
        self.nbytes += nbytes
        if self._on_count is not None:
            self._on_count(nbytes)
        return key

    def _release(self, key: int) -> None:
        entry = self._held[key]
        entry[0] -= 1
        if entry[0] == 0:
            del self._held[key]
            self.nbytes -= entry[1]
            if self._on_release is not None:
                self._on_release(entry[1])


def _unpack(packed: torch.Tensor | _SavedActivation) -> torch.Tensor:
    return packed.tensor if isinstance(packed, _SavedActivation) else packed


def _local_storage(tensor: torch.Tensor) -> torch.UntypedStorage:
    to_local = getattr(tensor, "to_local", None)
    if to_local is not None:
        tensor = to_local()
    return tensor.untyped_storage()
