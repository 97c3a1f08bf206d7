"""`auto_parallel`'s typed config: every key, its default and its meaning.

Light on purpose: every rank unpickles this config, so it imports no pandas,
plotting or report code."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from bench.config import (
    bounded,
    cell_timeout,
    check_choice,
    check_number,
    check_positive,
    check_types,
)
from impls.pipeline.schedules import PLANNER_SCHEDULES
from impls.planner.space import FIXED_KEYS

__all__ = ["AXES", "MODEL_FIELDS", "AutoParallelConfig"]

AXES = FIXED_KEYS  # the plan axes a run may fix: the planner's own list


def _spec_fields() -> tuple[str, ...]:
    from impls.costmodel.compute import TransformerSpec

    return tuple(f.name for f in fields(TransformerSpec))


MODEL_FIELDS = _spec_fields()
"""What `model.<field>=` overrides: every field of `TransformerSpec`."""


@dataclass(kw_only=True)
class AutoParallelConfig:
    model: dict[str, Any] = field(default_factory=lambda: {"preset": "gpt3_175b"})
    """The transformer: `model=<preset>` (experiments/model/, one file per
    `impls.costmodel.models.MODELS` entry), then any of its fields overridden by name
    (`model.seq_len=8192`, `model.n_layers=48`)."""
    hardware: Any = "a100_80gb"
    """The cluster: `hardware=<preset>` (experiments/hardware/, one file per
    `impls.costmodel.presets.HARDWARE` entry; fields override by name, as
    `hardware.devices_per_node=4`), or a preset file (`hardware=path/to/hardware.yaml`, as
    `device_profile` writes): device, memory, links, each number with its source."""
    gpus: list[int] = bounded(
        default_factory=lambda: [64, 256, 1024],
        ge=1,
        le=2**17,
        why="bounds the search's work; 131,072 GPUs is past the largest clusters announced",
    )
    """GPU counts to plan for (one search each)."""
    gpus_per_node: int | None = bounded(None, ge=1, le=1024)
    """Devices per node; None: the preset's."""
    global_batch: int = bounded(
        1536,
        ge=1,
        le=2**24,
        why="bounds the search's work; 16.8M sequences is over 10,000 × GPT-3's 1536",
    )
    """Sequences per optimizer step over all GPUs (GPT-3 175B: 1536 × 2048 tokens ≈ 3.2M)."""
    dtype: str = "bf16"
    """Compute dtype of the GEMMs (peak FLOP/s from the preset)."""
    dp: int | None = bounded(None, ge=1, le=2**17, why="auto_parallel's gpus bound")
    """Fixed data-parallel degree; null: searched. The same for every axis below."""
    tp: int | None = bounded(None, ge=1, le=2**17, why="auto_parallel's gpus bound")
    """Fixed tensor-parallel degree; null: searched."""
    pp: int | None = bounded(None, ge=1, le=2**17, why="auto_parallel's gpus bound")
    """Fixed pipeline-parallel degree (stages); null: searched."""
    sp: str | None = None
    """Sequence parallelism: none, megatron_sp or ulysses; null: searched."""
    zero_stage: int | None = bounded(None, ge=0, le=3)
    """Fixed ZeRO stage, 0 to 3; null: searched."""
    microbatch_size: int | None = bounded(None, ge=1, le=2**24, why="global_batch's bound")
    """Fixed sequences per micro-batch; null: searched."""
    schedule: str | None = None
    """One the planner searches (`impls.pipeline.schedules.PLANNER_SCHEDULES`: gpipe, 1f1b,
    interleaved_1f1b, zero_bubble_h1); null: searched."""
    virtual_stages: int | None = bounded(None, ge=1, le=1024, why="model chunks on one stage")
    """Fixed model chunks per rank for the interleaved schedule; null: searched."""
    recompute: str | None = None
    """none, selective or full; null: searched."""
    cp: list[int] = bounded([1], ge=1, le=2**17, why="auto_parallel's gpus bound")
    """Context-parallel degrees searched (ring attention over s/cp-token shards; each must
    divide the model's seq_len): [1] plans without it, [1, 2, 4] lets long sequences use
    it."""
    allow_cross_node_tp: bool = False
    """Let tensor parallelism span nodes (off: tp ≤ gpus_per_node, as Megatron-LM advises)."""
    top_k: int = bounded(5, ge=1, le=1000, why="plans listed")
    """Plans kept per GPU count, best first."""
    rejected_k: int = bounded(3, ge=0, le=1000, why="plans listed")
    """Best plans that lose (or do not fit) kept per GPU count, each with why."""
    timeout_s: float = cell_timeout(600.0)
    """A search not finished by then is recorded as failed."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, dict) or "preset" not in self.model:
            raise ValueError(
                f"model={self.model!r}: give model.preset (a preset name) and "
                f"optionally {', '.join(MODEL_FIELDS)}"
            )
        unknown = sorted(set(self.model) - {"preset", *MODEL_FIELDS})
        if unknown:
            raise ValueError(
                f"model has unknown key(s) {', '.join(unknown)}; allowed: preset, "
                f"{', '.join(MODEL_FIELDS)}"
            )
        self.spec()  # unknown preset / bad shape, naming the key
        self.cluster()  # unknown hardware preset
        check_positive("gpus", self.gpus)
        self.gpus = sorted(self.gpus)
        per_node = self.cluster().devices_per_node
        partial = [n for n in self.gpus if n > per_node and n % per_node]
        if partial:
            raise ValueError(
                f"gpus={self.gpus}: {partial} are not whole nodes of gpus_per_node={per_node}"
            )
        check_positive("global_batch", [self.global_batch])
        if self.gpus_per_node is not None:
            check_positive("gpus_per_node", [self.gpus_per_node])
        check_positive("cp", self.cp)
        bad = [cp for cp in self.cp if self.spec().seq_len % cp]
        if bad:
            raise ValueError(
                f"cp={self.cp}: {bad} do not divide the model's seq_len={self.spec().seq_len}"
            )
        check_positive("top_k", [self.top_k])
        check_positive("rejected_k", [self.rejected_k], minimum=0)
        check_number("timeout_s", self.timeout_s)
        for key in ("dp", "tp", "pp", "zero_stage", "microbatch_size", "virtual_stages"):
            value = getattr(self, key)
            if value is not None:
                check_positive(key, [value], minimum=0 if key == "zero_stage" else 1)
        if self.zero_stage is not None and self.zero_stage > 3:
            raise ValueError(f"zero_stage={self.zero_stage}: allowed values 0, 1, 2, 3")
        for key, allowed in (
            ("sp", ("none", "megatron_sp", "ulysses")),
            ("schedule", PLANNER_SCHEDULES),
            ("recompute", ("none", "selective", "full")),
        ):
            if getattr(self, key) is not None:
                check_choice(key, getattr(self, key), allowed)
        check_choice("dtype", self.dtype, tuple(self.cluster().peak_flops))
        spec = self.spec()
        for n in self.gpus:
            for key in ("dp", "tp", "pp"):
                value = getattr(self, key)
                if value is not None and n % value:
                    raise ValueError(f"{key}={value} does not divide gpus={n}")
            fixed = [getattr(self, k) or 1 for k in ("dp", "tp", "pp")]
            if None not in (self.dp, self.tp, self.pp) and fixed[0] * fixed[1] * fixed[2] != n:
                raise ValueError(f"dp×tp×pp = {fixed[0] * fixed[1] * fixed[2]} ≠ gpus={n}")
        if self.tp is not None:
            if spec.n_heads % self.tp:
                raise ValueError(f"tp={self.tp} does not divide the model's n_heads={spec.n_heads}")
            if self.tp > self.cluster().devices_per_node and not self.allow_cross_node_tp:
                raise ValueError(
                    f"tp={self.tp} is over gpus_per_node="
                    f"{self.cluster().devices_per_node} (set "
                    "allow_cross_node_tp=true to let it span nodes)"
                )
        if self.pp is not None and self.pp > spec.n_layers + 2:
            raise ValueError(
                f"pp={self.pp}: the model has only {spec.n_layers} layers "
                "(+ embedding and LM head) to cut into stages"
            )

    def spec(self) -> Any:
        """The `TransformerSpec` of `model`: the preset with the overrides applied."""
        from dataclasses import replace

        from impls.costmodel.models import model as preset_model

        try:
            base = preset_model(self.model["preset"])
            overrides = {k: v for k, v in self.model.items() if k != "preset"}
            check_types(type(base), overrides, "model.")
            return replace(base, **overrides) if overrides else base
        except (TypeError, ValueError) as error:
            raise ValueError(f"model: {error}") from None

    def hardware_name(self) -> str:
        """What the rows call the hardware: the preset's name, or the file's path."""
        if isinstance(self.hardware, dict):
            return str(self.hardware.get("preset") or self.hardware.get("path"))
        return str(self.hardware)

    def cluster(self) -> Any:
        """The `Hardware`: a preset by name, a preset file, or a preset's fields as the
        `hardware` group composes them (with any overridden); `gpus_per_node` applied."""
        from dataclasses import replace

        from impls.costmodel.hardware_file import read_hardware
        from impls.costmodel.presets import hardware

        values = self.hardware
        if isinstance(values, dict) and set(values) == {"path"}:
            values = values["path"]  # hardware=file hardware.path=...
        if isinstance(values, dict):
            fields_only = {k: v for k, v in values.items() if k != "preset"}
            hw = read_hardware(fields_only, f"hardware={self.hardware_name()}")
        elif isinstance(values, str):
            hw = hardware(values)  # its error names the key (and the file's)
        else:
            raise ValueError(f"hardware={values!r}: give a preset name or a preset file")
        return replace(hw, devices_per_node=self.gpus_per_node) if self.gpus_per_node else hw

    def fixed(self) -> dict[str, Any]:
        """The axes pinned by the config (the planner searches the others)."""
        return {key: getattr(self, key) for key in AXES if getattr(self, key) is not None}
