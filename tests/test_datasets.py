"""The real data sets, the batches drawn from them, and the tasks built on them.

`digits()` and `char_corpus()` load data that ships inside installed packages; `Batches`
gives step t's global batch, the same on every rank; `bench.kit.tasks.build_task` puts a
model, its loss, its batches and a held-out evaluation together for the
`gradient_compression` experiment.

A failure means the experiment trains or scores on other data than it says: a split that
leaks test images into training or changes between runs, ranks that draw different
batches for one step, an epoch that repeats rows, next-token targets off by one, or a
held-out score that is not a loss and an accuracy.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from bench.kit.tasks import EVAL_WINDOWS, TASKS, build_task, cosine
from impls.datasets import Batches, Split, char_corpus, digits
from impls.models import Classifier

# --- digits ---------------------------------------------------------------------------


def test_digits_shapes_range_and_classes():
    data = digits()
    assert data.x_train.shape == (1438, 64) and data.x_test.shape == (359, 64)
    assert data.y_train.shape == (1438,) and data.y_test.shape == (359,)
    assert data.x_train.dtype == torch.float32 and data.y_train.dtype == torch.long
    assert data.n_features == 64 and data.n_classes == 10
    for x in (data.x_train, data.x_test):
        assert x.min() == 0 and x.max() == 1  # 4-bit pixels 0..16, scaled by 1/16
    for y in (data.y_train, data.y_test):
        assert sorted(y.unique().tolist()) == list(range(10))


def _rows(x: torch.Tensor, y: torch.Tensor) -> Counter:
    return Counter((tuple(row), label) for row, label in zip(x.tolist(), y.tolist(), strict=True))


def test_digits_split_is_a_partition_of_the_data_set():
    """Every (image, label) of the data set lands in exactly one of train and test."""
    from sklearn.datasets import load_digits

    raw = load_digits()
    everything = _rows(torch.tensor(raw.data, dtype=torch.float32) / 16.0, torch.tensor(raw.target))
    data = digits()
    train, test = _rows(data.x_train, data.y_train), _rows(data.x_test, data.y_test)
    assert train + test == everything
    assert not set(train) & set(test)  # no image in both halves (the set has no duplicates)


def test_digits_split_is_deterministic_and_follows_its_seed():
    first = digits()
    digits.cache_clear()  # load and split again, not the cached Split
    again = digits()
    assert again is not first
    for name in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(again, name), getattr(first, name)), name
    other = digits(seed=1)
    assert not torch.equal(other.y_test, first.y_test)
    assert digits(test_fraction=0.5).x_test.shape[0] == round(0.5 * 1797)


# --- char corpus ------------------------------------------------------------------------


def _documentation_text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics))


def test_char_corpus_vocab_covers_both_halves_and_decodes_back_to_the_text():
    corpus = char_corpus()
    text = _documentation_text()
    assert corpus.vocab == "".join(sorted(set(text)))
    assert corpus.vocab_size == len(corpus.vocab)
    ids = torch.cat([corpus.train, corpus.test])
    assert ids.dtype == torch.long and ids.min() >= 0 and ids.max() < corpus.vocab_size
    assert corpus.decode(corpus.train) + corpus.decode(corpus.test) == text


def test_char_corpus_test_is_the_tail():
    corpus = char_corpus()
    text = _documentation_text()
    cut = len(corpus.train)
    assert cut == round(len(text) * 0.9) and len(corpus.test) == len(text) - cut
    assert corpus.decode(corpus.test) == text[cut:]
    assert len(char_corpus(test_fraction=0.5).test) == len(text) - round(len(text) * 0.5)


# --- batches -----------------------------------------------------------------------------


def _numbered_split(rows: int = 50) -> Split:
    """Row i holds the number i, so a batch tells which rows it drew."""
    x = torch.arange(rows, dtype=torch.float32).unsqueeze(1)
    return Split(x, torch.arange(rows), x[:2], torch.arange(2), n_classes=rows)


def test_same_step_same_batch_on_every_rank_and_different_steps_differ():
    for data, extra in ((digits(), {}), (char_corpus().train, {"seq_len": 16})):
        rank0, rank1 = Batches(data, 8, seed=3, **extra), Batches(data, 8, seed=3, **extra)
        for step in (0, 1, 57):
            a, b = rank0(step), rank1(step)
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
            again = rank0(step)  # and asking twice does not advance anything
            assert torch.equal(a[0], again[0])
        assert not torch.equal(rank0(0)[0], rank0(1)[0])
        assert not torch.equal(rank0(0)[0], Batches(data, 8, seed=4, **extra)(0)[0])


def test_a_classification_epoch_visits_each_row_at_most_once():
    data = _numbered_split(50)
    batches = Batches(data, 8, seed=1)
    per_epoch = 50 // 8  # 6 full batches; the last 2 rows of a permutation wait
    for epoch in range(3):
        seen = []
        for step in range(epoch * per_epoch, (epoch + 1) * per_epoch):
            x, y = batches(step)
            assert x.shape == (8, 1) and torch.equal(x[:, 0].long(), y)
            seen += y.tolist()
        assert len(seen) == len(set(seen)) == per_epoch * 8, epoch
    # A new epoch is a new permutation, not the old order again.
    assert not torch.equal(batches(0)[1], batches(per_epoch)[1])


def test_token_windows_are_contiguous_and_targets_are_inputs_shifted_by_one():
    tokens = torch.arange(1000)
    batches = Batches(tokens, 6, seq_len=10, seed=2)
    for step in range(4):
        x, y = batches(step)
        assert x.shape == y.shape == (6, 10)
        assert torch.equal(y[:, :-1], x[:, 1:])
        assert torch.equal(x, x[:, :1] + torch.arange(10))  # a window of the text
        assert torch.equal(y[:, -1], x[:, -1] + 1)
    corpus = char_corpus()
    x, y = Batches(corpus.train, 4, seq_len=32)(0)
    assert torch.equal(y[:, :-1], x[:, 1:])


@pytest.mark.parametrize(
    "make, key",
    [
        (lambda: Batches(_numbered_split(), 0), "batch_size"),
        (lambda: Batches(_numbered_split(), True), "batch_size"),
        (lambda: Batches(_numbered_split(), 2.5), "batch_size"),
        (lambda: Batches(_numbered_split(50), 51), "batch_size"),
        (lambda: Batches(torch.arange(100), 4), "seq_len"),  # None
        (lambda: Batches(torch.arange(100), 4, seq_len=0), "seq_len"),
        (lambda: Batches(torch.arange(100), 4, seq_len=99), "seq_len"),
        (lambda: Batches(torch.arange(100), 4, seq_len=2.5), "seq_len"),
        (lambda: Batches(torch.arange(100), 4, seq_len=True), "seq_len"),
        (lambda: digits(test_fraction=0), "test_fraction"),
        (lambda: digits(test_fraction=1), "test_fraction"),
        (lambda: digits(test_fraction=-0.1), "test_fraction"),
        (lambda: digits(test_fraction=True), "test_fraction"),
        (lambda: char_corpus(test_fraction=1.5), "test_fraction"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(make, key):
    with pytest.raises(ValueError, match=key):
        make()


# --- tasks and the classifier ----------------------------------------------------------------


@pytest.mark.parametrize("name", TASKS)
def test_build_task_evaluates_to_a_loss_and_an_accuracy(name):
    task = build_task(name, 8, seed=0)
    assert task.name == name
    loss, accuracy = task.evaluate()
    assert math.isfinite(loss) and loss > 0 and 0 <= accuracy <= 1
    x, y = task.batches(0)
    assert x.shape[0] == y.shape[0] == 8
    assert task.loss(task.model(x).float(), y).item() > 0
    if name == "digits":
        assert task.eval_inputs.shape == (359, 64) and task.eval_targets.shape == (359,)
        # untrained: about chance over 10 classes, cross-entropy near ln 10
        assert abs(loss - math.log(10)) < 0.5
    else:
        assert task.eval_inputs.shape == task.eval_targets.shape == (EVAL_WINDOWS, 64)
        assert torch.equal(task.eval_targets[:, :-1], task.eval_inputs[:, 1:])
    # Every rank builds the same model and held-out set from the seed.
    again = build_task(name, 8, seed=0)
    for a, b in zip(task.model.parameters(), again.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(task.eval_inputs, again.eval_inputs)
    other = build_task(name, 8, seed=1)
    assert not all(
        torch.equal(a, b)
        for a, b in zip(task.model.parameters(), other.model.parameters(), strict=True)
    )


def test_the_digits_task_is_learnable_and_evaluate_restores_training_mode():
    task = build_task("digits", 64, seed=0)
    optimizer = torch.optim.SGD(task.model.parameters(), lr=0.1, momentum=0.9)
    for step in range(40):
        x, y = task.batches(step)
        optimizer.zero_grad()
        task.loss(task.model(x), y).backward()
        optimizer.step()
    task.model.train()
    loss, accuracy = task.evaluate()
    assert task.model.training
    assert accuracy > 0.5 and loss < math.log(10)


def test_an_unknown_task_is_refused_naming_the_allowed_ones():
    with pytest.raises(ValueError, match="task='mnist'") as err:
        build_task("mnist", 8, seed=0)
    assert all(name in str(err.value) for name in TASKS)


def test_cosine_schedule_goes_from_one_to_zero():
    schedule = cosine(10)
    assert schedule(0) == 1 and schedule(5) == pytest.approx(0.5)
    assert schedule(10) == pytest.approx(0) and schedule(25) == pytest.approx(0)


def test_classifier_shapes_and_seeded_weights():
    model = Classifier(64, (32, 16), 10, seed=5)
    assert [(layer.in_features, layer.out_features) for layer in model.layers] == [
        (64, 32),
        (32, 16),
        (16, 10),
    ]
    x = torch.rand(7, 64)
    logits = model(x)
    assert logits.shape == (7, 10)
    targets = torch.arange(7) % 10
    assert Classifier.loss(logits, targets).shape == ()
    assert 0 <= Classifier.accuracy(logits, targets) <= 1
    assert torch.equal(Classifier(64, (32, 16), 10, seed=5)(x), logits)
    assert not torch.equal(Classifier(64, (32, 16), 10, seed=6)(x), logits)
    assert Classifier(3, (), 2)(torch.rand(4, 3)).shape == (4, 2)  # no hidden layer


@pytest.mark.parametrize(
    "args, key",
    [
        ((64, (32, 0), 10), "hidden_dims[1]"),
        ((64, (-4,), 10), "hidden_dims[0]"),
        ((64, (32, 2.5), 10), "hidden_dims[1]"),
        ((0, (32,), 10), "in_dim"),
        ((64, (32,), True), "n_classes"),
    ],
)
def test_classifier_bad_dims_are_refused_naming_the_key(args, key):
    with pytest.raises(ValueError, match=key.replace("[", r"\[").replace("]", r"\]")):
        Classifier(*args)


def test_chargpt_trains_at_its_default_learning_rate():
    # The default must not diverge (a too-large SGD step sends the char GPT's loss to NaN).
    from bench.kit.tasks import DEFAULT_BATCH, DEFAULT_LR

    task = build_task("chargpt", DEFAULT_BATCH["chargpt"], seed=0)
    before, _ = task.evaluate()
    opt = torch.optim.SGD(task.model.parameters(), lr=DEFAULT_LR["chargpt"], momentum=0.9)
    for step in range(40):
        x, y = task.batches(step)
        opt.zero_grad()
        task.loss(task.model(x), y).backward()
        opt.step()
    after, _ = task.evaluate()
    assert math.isfinite(after) and after < before - 0.5, (before, after)
