"""Cut a GPT or MLP into contiguous pipeline stages that share the model's parameters.

A stage is an `nn.Sequential` over the model's own submodules (no copies), so running the
stages one after another is the model's forward, and gradients computed through them land
in the model's `.grad`. For the GPT, stage 0 owns the embedding and the first blocks and the
last stage owns the final LayerNorm and the LM head; a 1-stage split is the whole model.
Stage 0 takes token ids (b, s), later stages take activations (b, s, d_model); the last
stage returns logits. MLP stages pass (b, width) activations.

By default the layers are split equally (`stage_layer_ranges`); `layer_counts` gives each
stage's count instead, as a planner chooses it (Alpa's stage slicing, `impls.planner`): a
GPT's first and last stage may then hold no block at all (the embedding, the LM head).
Virtual stages (interleaving): `split_into_virtual_stages`; tied embeddings: `Stage`.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from impls.models._checks import require_positive_ints
from impls.models.gpt import GPT
from impls.models.mlp import MLP

__all__ = [
    "Stage",
    "rank_of_stage",
    "split_into_stages",
    "split_into_virtual_stages",
    "stage_layer_ranges",
    "stage_ranges_of_counts",
    "stages_of_rank",
]


class Stage(nn.Sequential):
    """A contiguous run of a model's layers; `forward(x)` takes the previous stage's output.

    `index` is the stage's position in model order, `layer_ids` the model layers (GPT blocks
    or MLP Linear layers) it runs. Submodule names keep the model index (`block3`, `layer3`).
    `tied_weight` is the token-embedding matrix the LM head shares, on the first and the last
    stage of a tied GPT; None elsewhere.

    Tied embeddings (`GPTConfig.tie_embeddings`): stage 0's token embedding and the last stage's
    LM head stay one Parameter, and both stages name it as `tied_weight` (None on every other
    stage, and on every stage of an untied model). Every rank builds the whole model from one
    seed, so the first stage's rank and the last stage's rank hold bit-identical copies; each
    backward fills only its own use's share of the gradient, so a pipeline that places the two
    stages on different ranks must add the shares after the backward, as Megatron's embedding
    group does: `impls.pipeline.tied.EmbeddingGroup`. On one rank (P = 1) the shares already
    meet in the one Parameter's `.grad`.
    """

    def __init__(
        self,
        modules: OrderedDict[str, nn.Module],
        *,
        index: int,
        n_stages: int,
        layer_ids: range,
        tied_weight: nn.Parameter | None = None,
    ) -> None:
        super().__init__(modules)
        self.index = index
        self.n_stages = n_stages
        self.layer_ids = layer_ids
        # A plain attribute holding a Parameter would register it a second time under a new
        # name; kept in a tuple, it stays out of `parameters()` and `state_dict()`.
        self._tied = (tied_weight,)

    @property
    def tied_weight(self) -> nn.Parameter | None:
        """The embedding / LM-head Parameter of a tied GPT on its first and last stage."""
        return self._tied[0]

    @property
    def is_first(self) -> bool:
        """Whether this stage consumes the model's input (token ids, for the GPT)."""
        return self.index == 0

    @property
    def is_last(self) -> bool:
        """Whether this stage produces the model's output (logits, for the GPT)."""
        return self.index == self.n_stages - 1

    def extra_repr(self) -> str:
        return f"index={self.index}/{self.n_stages}, layers={list(self.layer_ids)}"


def _layer_count(model: nn.Module) -> tuple[int, str]:
    """(number of splittable layers, what they are called) for a supported model."""
    if isinstance(model, GPT):
        return len(model.blocks), "blocks"
    if isinstance(model, MLP):
        return len(model.layers), "Linear layers"
    raise TypeError(f"cannot split a {type(model).__name__} into stages: expected GPT or MLP")


def stage_layer_ranges(n_layers: int, n_stages: int, *, unit: str = "layers") -> list[range]:
    """Split layers 0..n_layers-1 into `n_stages` contiguous, balanced ranges.

    Sizes differ by at most one; the first `n_layers % n_stages` stages take the extra layer.
    Raises ValueError naming `stages` when a stage would be empty.
    """
    require_positive_ints("split", stages=n_stages, n_layers=n_layers)
    if n_stages > n_layers:
        raise ValueError(
            f"stages={n_stages} exceeds the model's {n_layers} {unit}: each stage needs at "
            f"least one, so stages must be in 1..{n_layers}"
        )
    base, extra = divmod(n_layers, n_stages)
    ranges, start = [], 0
    for i in range(n_stages):
        size = base + (1 if i < extra else 0)
        ranges.append(range(start, start + size))
        start += size
    return ranges


def stage_ranges_of_counts(
    layer_counts: list[int] | tuple[int, ...],
    n_layers: int,
    *,
    ends_hold_layers: bool = False,
    unit: str = "layers",
) -> list[range]:
    """Contiguous ranges of `layer_counts[i]` layers each, in model order.

    The counts must sum to `n_layers`; every stage needs ≥ 1 layer, except the first and
    the last when `ends_hold_layers` (a GPT's embedding and LM head are work of their own).
    Raises ValueError naming `layer_counts` otherwise.
    """
    counts = list(layer_counts)
    if any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts):
        raise ValueError(f"layer_counts={counts!r}: every count must be an int ≥ 0")
    if sum(counts) != n_layers:
        raise ValueError(
            f"layer_counts={counts!r} sum to {sum(counts)}, not the model's {n_layers} {unit}"
        )
    inner = counts[1:-1] if ends_hold_layers else counts
    if not counts or 0 in inner:
        where = "a middle stage" if ends_hold_layers else "a stage"
        held = " (only the first and last hold other layers)" if ends_hold_layers else ""
        raise ValueError(
            f"layer_counts={counts!r}: {where} with no {unit} has nothing to "
            f"run{held}; every such stage needs ≥ 1"
        )
    ranges, start = [], 0
    for count in counts:
        ranges.append(range(start, start + count))
        start += count
    return ranges


def _gpt_stage_modules(model: GPT, layer_ids: range, *, first: bool, last: bool) -> OrderedDict:
    modules: OrderedDict[str, nn.Module] = OrderedDict()
    if first:
        modules["embedding"] = model.embedding
    for j in layer_ids:
        modules[f"block{j}"] = model.blocks[j]
    if last:
        modules["ln_f"] = model.ln_f
        modules["lm_head"] = model.lm_head
    return modules


def _mlp_stage_modules(model: MLP, layer_ids: range) -> OrderedDict:
    return OrderedDict((f"layer{j}", model.layers[j]) for j in layer_ids)


def split_into_stages(
    model: GPT | MLP, n_stages: int, layer_counts: list[int] | tuple[int, ...] | None = None
) -> list[Stage]:
    """Cut `model` into `n_stages` contiguous stages in model order, sharing its parameters:
    equal ones, or `layer_counts[i]` blocks (Linear layers) on stage i (see
    `stage_ranges_of_counts`: a GPT's end stages may hold no block)."""
    n_layers, unit = _layer_count(model)
    if layer_counts is None:
        ranges = stage_layer_ranges(n_layers, n_stages, unit=unit)
    else:
        require_positive_ints("split", stages=n_stages)
        if len(layer_counts) != n_stages:
            raise ValueError(
                f"layer_counts={list(layer_counts)!r}: {len(layer_counts)} "
                f"counts for stages={n_stages}"
            )
        ranges = stage_ranges_of_counts(
            layer_counts, n_layers, unit=unit, ends_hold_layers=isinstance(model, GPT)
        )
    tied = _tied_weight(model)
    stages = []
    for i, layer_ids in enumerate(ranges):
        first, last = i == 0, i == n_stages - 1
        if isinstance(model, GPT):
            modules = _gpt_stage_modules(model, layer_ids, first=first, last=last)
        else:
            modules = _mlp_stage_modules(model, layer_ids)
        stage_tied = tied if first or last else None
        stages.append(
            Stage(modules, index=i, n_stages=n_stages, layer_ids=layer_ids, tied_weight=stage_tied)
        )
    return stages


def _tied_weight(model: GPT | MLP) -> nn.Parameter | None:
    """The Parameter a GPT's token embedding and LM head share, or None (untied, or MLP).

    Read from the modules, not the config: it is the sharing itself that makes the two
    stages' gradients two halves of one (and `parallelize_gpt` keeps it, sharded).
    """
    if not isinstance(model, GPT):
        return None
    weight = model.embedding.tok.weight
    if model.lm_head.weight is not weight:
        if model.cfg.tie_embeddings:
            raise ValueError(
                "GPTConfig.tie_embeddings=True but lm_head.weight is not embedding.tok.weight: "
                "the tie was broken after the model was built; split the model as built"
            )
        return None
    return weight


def split_into_virtual_stages(model: GPT | MLP, n_ranks: int, n_virtual: int) -> list[Stage]:
    """Cut `model` into `n_ranks * n_virtual` stages in model order (Megatron interleaving).

    Stage i runs on rank `i % n_ranks`; `stages_of_rank` lists a rank's stages in the order
    it holds them. `n_virtual=1` is the ordinary split.

    Virtual stages follow the interleaved schedule of Narayanan et al., 2021, "Efficient
    Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (arXiv 2104.04473):
    the model is cut into P * V stages in model order and rank r runs stages r, r + P, ...
    """
    require_positive_ints("split_into_virtual_stages", n_ranks=n_ranks, n_virtual=n_virtual)
    n_layers, unit = _layer_count(model)
    n_stages = n_ranks * n_virtual
    if n_stages > n_layers:
        raise ValueError(
            f"stages={n_stages} (n_ranks={n_ranks} x n_virtual={n_virtual}) exceeds the "
            f"model's {n_layers} {unit}: each stage needs at least one"
        )
    return split_into_stages(model, n_stages)


def stages_of_rank(rank: int, n_ranks: int, n_virtual: int) -> list[int]:
    """Stage indices rank `rank` owns under interleaving: rank, rank + P, rank + 2P, ..."""
    require_positive_ints("stages_of_rank", n_ranks=n_ranks, n_virtual=n_virtual)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < n_ranks:
        raise ValueError(f"stages_of_rank: rank={rank!r} must be an int in 0..{n_ranks - 1}")
    return [rank + v * n_ranks for v in range(n_virtual)]


def rank_of_stage(stage: int, n_ranks: int) -> int:
    """The rank that runs stage `stage` under interleaving (stage mod P)."""
    require_positive_ints("rank_of_stage", n_ranks=n_ranks)
    if isinstance(stage, bool) or not isinstance(stage, int) or stage < 0:
        raise ValueError(f"rank_of_stage: stage={stage!r} must be an int >= 0")
    return stage % n_ranks
