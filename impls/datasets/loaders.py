"""Loaders for the data sets that ship inside packages, and reproducible batching."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

__all__ = ["Batches", "CharCorpus", "Split", "char_corpus", "digits"]


@dataclass(frozen=True)
class Split:
    """A classification data set cut into train and test tensors."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    n_classes: int

    @property
    def n_features(self) -> int:
        return int(self.x_train.shape[1])


def _check_fraction(test_fraction: float) -> float:
    if isinstance(test_fraction, bool) or not (
        isinstance(test_fraction, int | float) and 0 < test_fraction < 1
    ):
        raise ValueError(f"test_fraction={test_fraction!r}: must be in (0, 1)")
    return float(test_fraction)


@lru_cache(maxsize=4)
def digits(test_fraction: float = 0.2, seed: int = 0) -> Split:
    """scikit-learn's 8×8 digits, pixels scaled to [0, 1], split by a seeded permutation."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:  # pragma: no cover - a dependency of the package
        raise ImportError("the digits task needs scikit-learn: pip install scikit-learn") from err
    test_fraction = _check_fraction(test_fraction)
    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = round(test_fraction * len(y))
    test, train = order[:n_test], order[n_test:]
    return Split(x[train], y[train], x[test], y[test], n_classes=10)


@dataclass(frozen=True)
class CharCorpus:
    """A text as character ids: `train`/`test` are 1-D long tensors over `vocab`."""

    train: torch.Tensor
    test: torch.Tensor
    vocab: str

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def decode(self, ids: torch.Tensor) -> str:
        return "".join(self.vocab[i] for i in ids.tolist())


@lru_cache(maxsize=2)
def char_corpus(test_fraction: float = 0.1) -> CharCorpus:
    """Python's reference documentation (`pydoc_data.topics`), topics in sorted order;
    the last `test_fraction` of the characters is held out."""
    from pydoc_data.topics import topics

    test_fraction = _check_fraction(test_fraction)
    text = "\n\n".join(topics[name] for name in sorted(topics))
    vocab = "".join(sorted(set(text)))
    lookup = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([lookup[c] for c in text], dtype=torch.long)
    cut = round(len(ids) * (1 - test_fraction))
    return CharCorpus(ids[:cut], ids[cut:], vocab)


class Batches:
    """Step t's global batch, identical on every rank: `batches(t) -> (inputs, targets)`.

    For a classification `Split`, `batch_size` rows drawn without replacement inside
    epochs (a seeded permutation per epoch). For a 1-D token tensor, `batch_size` windows
    of `seq_len + 1` tokens at seeded random offsets (inputs and next-token targets).
    """

    def __init__(
        self,
        data: Split | torch.Tensor,
        batch_size: int,
        *,
        seq_len: int | None = None,
        seed: int = 0,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r}: must be an integer ≥ 1")
        self.data, self.batch_size, self.seq_len, self.seed = data, batch_size, seq_len, seed
        if isinstance(data, Split):
            if batch_size > len(data.y_train):
                raise ValueError(
                    f"batch_size={batch_size} exceeds the {len(data.y_train)} training rows"
                )
            self._per_epoch = len(data.y_train) // batch_size
        elif type(seq_len) is not int or not 1 <= seq_len < data.numel() - 1:  # bools too
            raise ValueError(
                f"seq_len={seq_len!r}: token batches need 1 ≤ seq_len ≤ len(tokens) − 2"
            )

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(self.data, Split):
            epoch, slot = divmod(step, self._per_epoch)
            g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            order = torch.randperm(len(self.data.y_train), generator=g)
            rows = order[slot * self.batch_size : (slot + 1) * self.batch_size]
            return self.data.x_train[rows], self.data.y_train[rows]
        g = torch.Generator().manual_seed(self.seed * 100_003 + step)
        starts = torch.randint(
            0, self.data.numel() - self.seq_len - 1, (self.batch_size,), generator=g
        )
        windows = torch.stack([self.data[s : s + self.seq_len + 1] for s in starts.tolist()])
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
