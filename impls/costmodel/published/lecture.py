"""The lecture's own scale figures, with the assumptions they rest on."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LECTURE_FIGURES", "LectureFigure"]


@dataclass(frozen=True, kw_only=True)
class LectureFigure:
    """A number the lecture states, with what it rests on."""

    name: str
    value: float
    unit: str
    quote: str
    gpus: int | None = None
    assumptions: tuple[str, ...] = ()
    source: str = "seeds/003_2bd2ae9b9700d803.txt (EfficientML.ai Lecture 19, Part I)"


_GPT3 = (
    "300B training tokens and 3.14e23 training FLOPs (Brown et al. 2020, §2.2 and Table "
    "D.1; 6·175e9·300e9 = 3.15e23)",
    "The lecture's table says 'Measured on Nvidia A100' but cites lambdalabs.com/blog/"
    "demystifying-gpt-3; 3.14e23 FLOP / (3.1e6 h · 3600 s) = 28 TFLOP/s sustained per GPU, "
    "a V100-class rate, far below an A100's 312 TFLOP/s 16-bit peak",
    "355 years = 3.1e6 GPU-hours / 8766 h per year (one GPU, no parallelism)",
)
_TSM = (
    "Model: 8-frame ResNet-50 TSM (Lin, Gan, Han 2019); the shift adds no FLOPs",
    "Data: Kinetics, 240k training videos × 100 epochs ('660 hours of videos')",
    "SUMMIT node: 6 × NVIDIA Tesla V100, dual-rail EDR InfiniBand 200 Gbit/s (lecture slide)",
)

LECTURE_FIGURES: tuple[LectureFigure, ...] = (
    LectureFigure(
        name="gpt3_gpu_hours",
        value=3.1e6,
        unit="GPU-hours",
        quote="GPT-3 175B | 175,000 (M params) | 3,100,000 (GPU hours)",
        gpus=1,
        assumptions=_GPT3,
    ),
    LectureFigure(
        name="gpt3_single_gpu_years",
        value=355,
        unit="years",
        quote="a single GPU would take 355 years to finish GPT-3",
        gpus=1,
        assumptions=_GPT3,
    ),
    LectureFigure(
        name="resnet50_gpu_hours",
        value=31,
        unit="GPU-hours",
        quote="ResNet-50 | 26 (M params) | 31 (GPU hours), measured on A100",
        gpus=1,
        assumptions=("lambdalabs.com/blog/demystifying-gpt-3 as cited",),
    ),
    LectureFigure(
        name="ten_gpu_days_on_1024",
        value=14,
        unit="minutes",
        quote="If a training takes 10 GPU days ... 1024 GPUs can finish in 14 minutes (ideally)",
        gpus=1024,
        assumptions=("linear scaling: 10·24·60 / 1024 = 14.06 min",),
    ),
    LectureFigure(
        name="tsm_summit_1_node",
        value=49 * 60 + 50,
        unit="minutes",
        quote="1 SUMMIT Nodes (6 GPUs) | 49h 50min | 74.1%",
        gpus=6,
        assumptions=_TSM,
    ),
    LectureFigure(
        name="tsm_summit_128_nodes",
        value=28,
        unit="minutes",
        quote="128 SUMMIT Nodes (768 GPUs) | 28min | 74.1%",
        gpus=768,
        assumptions=_TSM,
    ),
    LectureFigure(
        name="tsm_summit_256_nodes",
        value=14,
        unit="minutes",
        quote="256 SUMMIT Nodes (1536 GPUs) | 14min (211x) | 74.0%",
        gpus=1536,
        assumptions=_TSM + ("211x = 2990 min / 14.2 min: the 14 min is rounded",),
    ),
)
