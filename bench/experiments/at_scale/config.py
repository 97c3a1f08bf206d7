"""`at_scale`'s typed config: every key, its default and its meaning.

Light on purpose: every rank unpickles this config, so it imports no pandas,
plotting or report code."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.config import bounded, cell_timeout, check_choice, check_number, check_positive

__all__ = ["LECTURE_ROWS", "AtScaleConfig"]

LECTURE_ROWS = (
    "gpt3_gpu_hours",
    "gpt3_gpu_hours_lambda",
    "gpt3_one_gpu_years",
    "summit_6",
    "summit_768",
    "summit_1536",
    "chinchilla",
)


@dataclass(kw_only=True)
class AtScaleConfig:
    lecture: list[str] = field(default_factory=lambda: list(LECTURE_ROWS))
    """The lecture's scale figures to predict (any of gpt3_gpu_hours, gpt3_gpu_hours_lambda,
    gpt3_one_gpu_years, summit_6, summit_768, summit_1536, chinchilla)."""
    published: list[str] | None = None
    """Names of published runs (`impls.costmodel.published.PUBLISHED_RUNS`) to predict;
    null: all of them."""
    gpt3_gpus: int = bounded(1024, ge=1, le=2**17, why="auto_parallel's gpus bound")
    """GPUs the GPT-3 175B run is planned on (the planner picks the layout)."""
    gpt3_hardware: str = "a100_80gb"
    """The cluster preset (`impls.costmodel.presets.HARDWARE`) the GPT-3 run is planned
    on, or a preset file (`path/to/hardware.yaml`, as `device_profile` writes)."""
    # 1e18 FLOPs is about one A100-hour (312 TFLOP/s bf16 peak, datasheet): less is not a
    # run at scale, and 1e-30 predicted "0 days" with status ok.
    chinchilla_flops: float = bounded(
        5.76e23, ge=1e18, le=1e30, why="over 10,000 × GPT-4's 2e25, Epoch AI's estimate"
    )
    """Compute budget C (FLOPs) of the compute-optimal run: N = √(C/120), D = 20N (the
    default is Chinchilla's own budget, Hoffmann et al. 2022)."""
    chinchilla_model: str = "llama2_70b"
    """The transformer shape whose step is priced for the Chinchilla run (its parameter
    count should be near √(C/120); the report states both)."""
    chinchilla_gpus: int = bounded(1024, ge=1, le=2**17, why="auto_parallel's gpus bound")
    """GPUs the Chinchilla run is planned on (the planner picks the layout)."""
    chinchilla_hardware: str = "a100_80gb"
    """The cluster preset (or preset file) the Chinchilla run is planned on."""
    timeout_s: float = cell_timeout(600.0)
    """A cell not finished by then is recorded as failed."""

    def __post_init__(self) -> None:
        from impls.costmodel.models import MODELS
        from impls.costmodel.presets import hardware
        from impls.costmodel.published import PUBLISHED_RUNS

        bad = [name for name in self.lecture if name not in LECTURE_ROWS]
        if bad:
            raise ValueError(
                f"lecture={self.lecture} has unknown value(s) {bad}; allowed "
                f"values: {', '.join(LECTURE_ROWS)}"
            )
        names = [run.name for run in PUBLISHED_RUNS]
        if self.published is not None:
            bad = [name for name in self.published if name not in names]
            if bad:
                raise ValueError(
                    f"published={self.published} has unknown value(s) {bad}; "
                    f"allowed values: {', '.join(names)}"
                )
        check_positive("gpt3_gpus", [self.gpt3_gpus])
        check_positive("chinchilla_gpus", [self.chinchilla_gpus])
        for key in ("gpt3_hardware", "chinchilla_hardware"):  # a preset, or a preset file
            hardware(getattr(self, key), key=key)
        check_choice("chinchilla_model", self.chinchilla_model, tuple(MODELS))
        check_number("chinchilla_flops", self.chinchilla_flops)
        check_number("timeout_s", self.timeout_s)

    def published_names(self) -> list[str]:
        from impls.costmodel.published import PUBLISHED_RUNS

        names = [run.name for run in PUBLISHED_RUNS]
        return names if self.published is None else [n for n in names if n in self.published]
