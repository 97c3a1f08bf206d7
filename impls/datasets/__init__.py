"""Real training data that ships inside installed packages (nothing is downloaded).

- `digits()`: scikit-learn's handwritten digits (UCI ML, 1,797 8×8 grey images of 0–9,
  stored in the scikit-learn wheel) for a small classifier.
- `char_corpus()`: the English text of Python's own reference documentation, shipped with
  CPython as `pydoc_data.topics` (~465k characters), for a character-level GPT.

Both return a deterministic train/test split as tensors; `Batches` draws reproducible
minibatches from a training set, the same global batch on every rank for a given step.
"""

from impls.datasets.loaders import Batches, CharCorpus, Split, char_corpus, digits

__all__ = ["Batches", "CharCorpus", "Split", "char_corpus", "digits"]
