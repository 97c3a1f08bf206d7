"""Published training runs, each with its full layout, to hold the simulator against; and the
lecture's own scale figures with the assumptions they rest on.

Every number below was read in the cited source (paper table, README or documentation
page). Where a layout detail is not published, the row still needs a value for the
simulator; such fields are named in the row's `assumed` tuple and explained in `notes`.
Metrics are kept exactly as the source states them, with the FLOP convention it counts by:
`model` (the FLOPs the model needs, 6·N·D-like: MFU) or `hardware_full_recompute`
(Megatron-LM SC'21 style, counting the recomputed forward: 96·B·s·l·h²(1 + s/6h + V/16lh)
per step, Narayanan et al. 2021, §5.1).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from impls.costmodel.models import MODELS

__all__ = [
    "FLOPS_CONVENTIONS",
    "HARDWARE_NAMES",
    "LECTURE_FIGURES",
    "PUBLISHED_RUNS",
    "LectureFigure",
    "PublishedRun",
    "published_run",
]

HARDWARE_NAMES = ("a100_40gb", "a100_80gb", "h100_sxm", "v100_32gb", "v100_summit")
SP_KINDS = ("none", "megatron_sp")
SCHEDULES = ("1f1b", "interleaved_1f1b", "gpipe")
RECOMPUTE_KINDS = ("none", "selective", "full")
FLOPS_CONVENTIONS = ("model", "hardware_full_recompute")


def _allowed(key: str, value: object, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"PublishedRun.{key}={value!r}: allowed values: {', '.join(allowed)}")


@dataclass(frozen=True, kw_only=True)
class PublishedRun:
    """One published run: layout, batch, precision, and the throughput its source reports."""

    name: str
    model: str
    """A key of `impls.costmodel.models.MODELS`."""
    hardware: str
    gpus: int
    gpus_per_node: int
    dp: int
    tp: int
    pp: int
    sp: str
    zero_stage: int
    microbatch_size: int
    global_batch: int
    """Sequences per optimizer step."""
    seq_len: int
    schedule: str
    virtual_stages: int
    recompute: str
    dtype: str
    flops_convention: str
    source: str
    notes: str
    tflops_per_gpu: float | None = None
    tokens_per_s_per_gpu: float | None = None
    mfu: float | None = None
    hfu: float | None = None
    assumed: tuple[str, ...] = ()
    """Fields whose value is not published: chosen here, explained in `notes`."""

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"PublishedRun.model={self.model!r}: not a key of MODELS")
        _allowed("hardware", self.hardware, HARDWARE_NAMES)
        _allowed("sp", self.sp, SP_KINDS)
        _allowed("schedule", self.schedule, SCHEDULES)
        _allowed("recompute", self.recompute, RECOMPUTE_KINDS)
        _allowed("flops_convention", self.flops_convention, FLOPS_CONVENTIONS)
        if self.dp * self.tp * self.pp != self.gpus:
            raise ValueError(f"{self.name}: dp·tp·pp = {self.dp}·{self.tp}·{self.pp} "
                             f"!= gpus={self.gpus}")  # fmt: skip
        if self.global_batch % (self.dp * self.microbatch_size):
            per_step = self.dp * self.microbatch_size
            raise ValueError(f"{self.name}: global_batch={self.global_batch} is not a "
                             f"multiple of dp·microbatch_size={per_step}")  # fmt: skip
        names = {f.name for f in fields(self)}
        unknown = [key for key in self.assumed if key not in names]
        if unknown:
            raise ValueError(f"{self.name}: assumed names unknown fields {unknown}")
        if not any(v is not None for v in (self.tflops_per_gpu, self.tokens_per_s_per_gpu,
                                             self.mfu, self.hfu)):  # fmt: skip
            raise ValueError(f"{self.name}: no published metric")

    @property
    def num_microbatches(self) -> int:
        return self.global_batch // (self.dp * self.microbatch_size)

    @property
    def tokens_per_s(self) -> float | None:
        """Whole-job tokens per second, where the source gives a per-GPU rate."""
        if self.tokens_per_s_per_gpu is None:
            return None
        return self.tokens_per_s_per_gpu * self.gpus


_SC21 = "Narayanan et al. 2021, 'Efficient Large-Scale Language Model Training on GPU "
_SC21 += "Clusters Using Megatron-LM' (SC'21, arXiv 2104.04473), Table 1"
_SC21_NOTES = (
    "Selene, DGX A100 80GB nodes (8 GPUs); TFLOP/s and % of peak (312 TFLOP/s 16-bit) as "
    "Table 1 states them, counted with full activation recomputation (hfu = % of peak). "
    "Table 1 gives no micro-batch size or schedule: microbatch_size 1 and non-interleaved "
    "1F1B are our choices; 16-bit precision follows from the % of the 312 TFLOP/s peak."
)
_SC21_ASSUMED = ("microbatch_size", "schedule", "virtual_stages", "dtype")


def _sc21(size: str, model: str, tp: int, pp: int, gpus: int, batch: int, tflops: float,
          peak_pct: float) -> PublishedRun:  # fmt: skip
    return PublishedRun(
        name=f"megatron_sc21_{size}", model=model, hardware="a100_80gb", gpus=gpus,
        gpus_per_node=8, dp=gpus // (tp * pp), tp=tp, pp=pp, sp="none", zero_stage=0,
        microbatch_size=1, global_batch=batch, seq_len=2048, schedule="1f1b",
        virtual_stages=1, recompute="full", dtype="fp16",
        flops_convention="hardware_full_recompute", source=_SC21, notes=_SC21_NOTES,
        tflops_per_gpu=tflops, hfu=peak_pct / 100, assumed=_SC21_ASSUMED,
    )  # fmt: skip


_README_MFU = (
    "NVIDIA/Megatron-LM README, 'Training Speed and Scalability': MFU/HFU table "
    "(22B, 175B, 530B, 1T), measured with data-parallel size 1; method of Korthikanti et "
    "al. 2022 (arXiv 2205.05198)"
)
_README_NOTES = (
    "The README states only MFU, HFU, A100 80GB (Selene) and dp = 1. Layout and batch "
    "(tp 8; pp 1/8/35/64 on 8/64/280/512 GPUs; global batch 4/64/280/512, micro-batch 1) "
    "are recalled from Korthikanti et al. 2022, Table 3, not re-read for this table; "
    "sequence parallelism with selective recomputation is the paper's headline setting."
)
_README_ASSUMED = ("gpus", "tp", "pp", "microbatch_size", "global_batch", "schedule",
                   "virtual_stages", "dtype", "sp", "recompute")  # fmt: skip


def _korthikanti(size: str, model: str, pp: int, batch: int, mfu: float,
                 hfu: float) -> PublishedRun:  # fmt: skip
    return PublishedRun(
        name=f"megatron_readme_{size}", model=model, hardware="a100_80gb", gpus=8 * pp,
        gpus_per_node=8, dp=1, tp=8, pp=pp, sp="megatron_sp", zero_stage=0,
        microbatch_size=1, global_batch=batch, seq_len=2048, schedule="1f1b",
        virtual_stages=1, recompute="selective", dtype="bf16", flops_convention="model",
        source=_README_MFU, notes=_README_NOTES, mfu=mfu, hfu=hfu, assumed=_README_ASSUMED,
    )  # fmt: skip


_NEMO = (
    "NVIDIA NeMo Framework 24.12 user guide, 'Performance Benchmarks', Pretraining table "
    "(docs.nvidia.com/nemo-framework/user-guide/24.12/nemotoolkit/performance/"
    "performance_summary.html): #GPUs, GBS, MBS, TP, PP, CP = 1, VP, tokens/s/GPU, model "
    "TFLOP/s/GPU, FP8"
)
_NEMO_NOTES = (
    "The table is 'pre-training performance ... at FP8 precision'; the stored excerpt names "
    "no GPU. A100 has no FP8 and a 312 TFLOP/s 16-bit peak below these rates, so H100 SXM "
    "(DGX H100, NeMo's H100 FP8 recipes) is inferred. VP > 1 is Megatron's interleaved "
    "schedule. Sequence parallelism, the distributed optimizer (ZeRO-1) and no "
    "recomputation are NeMo's usual recipe settings, not stated in the table."
)
_NEMO_ASSUMED = ("hardware", "sp", "zero_stage", "recompute")
_NEMO_25_02 = (
    "NVIDIA NeMo Framework user guide, 'Performance' (NeMo 2.0, container 25.02), "
    "Pretraining at FP8, 'System: DGX-H100' table (docs.nvidia.com/nemo-framework/"
    "user-guide/latest/performance/performance_summary.html): GPT3-175B, 512 GPUs, GBS "
    "2048, MBS 2, TP 4, PP 8, CP 1, VP 6, GA 64, 866 tokens/s/GPU, 932 model TFLOP/s/GPU"
)
_NEMO_25_02_NOTES = (
    "DGX H100 stated by the page. The 24.12 rows use this same layout for GPT3-175B at 512 "
    "GPUs (825 tokens/s/GPU), which supports reading them as H100 too. Sequence "
    "parallelism, ZeRO-1 (distributed optimizer) and no recomputation are assumed."
)


def _nemo(name: str, model: str, gpus: int, gbs: int, mbs: int, seq: int, tp: int, pp: int,
          vp: int, tokens: float, tflops: float, *, source: str = _NEMO, notes: str = _NEMO_NOTES,
          assumed: tuple[str, ...] = _NEMO_ASSUMED) -> PublishedRun:  # fmt: skip
    return PublishedRun(
        name=name, model=model, hardware="h100_sxm", gpus=gpus,
        gpus_per_node=8, dp=gpus // (tp * pp), tp=tp, pp=pp,
        sp="megatron_sp" if tp > 1 else "none", zero_stage=1, microbatch_size=mbs,
        global_batch=gbs, seq_len=seq, schedule="interleaved_1f1b" if vp > 1 else "1f1b",
        virtual_stages=vp, recompute="none", dtype="fp8", flops_convention="model",
        source=source, notes=notes, tflops_per_gpu=tflops, tokens_per_s_per_gpu=tokens,
        assumed=assumed,
    )  # fmt: skip


PUBLISHED_RUNS: tuple[PublishedRun, ...] = (
    # Narayanan et al. 2021, Table 1 (weak scaling, V = 51200, s = 2048).
    _sc21("1_7b", "megatron_1_7b", 1, 1, 32, 512, 137, 44),
    _sc21("3_6b", "megatron_3_6b", 2, 1, 64, 512, 138, 44),
    _sc21("7_5b", "megatron_7_5b", 4, 1, 128, 512, 142, 46),
    _sc21("18_4b", "megatron_18_4b", 8, 1, 256, 1024, 135, 43),
    _sc21("39_1b", "megatron_39_1b", 8, 2, 512, 1536, 138, 44),
    _sc21("76_1b", "megatron_76_1b", 8, 4, 1024, 1792, 140, 45),
    _sc21("145_6b", "megatron_145_6b", 8, 8, 1536, 2304, 148, 47),
    _sc21("310_1b", "megatron_310_1b", 8, 16, 1920, 2160, 155, 50),
    _sc21("529_6b", "megatron_529_6b", 8, 35, 2520, 2520, 163, 52),
    _sc21("1t", "megatron_1t", 8, 64, 3072, 3072, 163, 52),
    # Megatron-LM README MFU / HFU (Korthikanti et al. 2022 settings), dp = 1.
    _korthikanti("22b", "megatron_22b", 1, 4, 0.415, 0.437),
    _korthikanti("175b", "megatron_gpt_175b", 8, 64, 0.514, 0.528),
    _korthikanti("530b", "megatron_529_6b", 35, 280, 0.560, 0.570),
    _korthikanti("1t", "megatron_1t", 64, 512, 0.563, 0.570),
    # BLOOM 176B on Jean Zay.
    PublishedRun(
        name="bloom_176b",
        model="bloom_176b",
        hardware="a100_80gb",
        gpus=384,
        gpus_per_node=8,
        dp=8,
        tp=4,
        pp=12,
        sp="none",
        zero_stage=1,
        microbatch_size=2,
        global_batch=2048,
        seq_len=2048,
        schedule="1f1b",
        virtual_stages=1,
        recompute="full",
        dtype="bf16",
        flops_convention="hardware_full_recompute",
        source="bigscience-workshop/bigscience train/tr11-176B-ml/README.md ('Global batch "
        "size': 384 GPUs, TP=4, PP=12, DP=8, MBS=2, GBS=2048, SEQ_LEN=2048); BigScience "
        "176B model page ('training throughput: about 150 TFLOPs', 384 A100 80GB); Le Scao "
        "et al. 2022 (arXiv 2211.05100), training setup: bf16, 48 nodes of 8 A100 80GB",
        notes="150 TFLOP/s is 'about'. ZeRO stage 1 is from a secondary summary "
        "(liguodongiot/llm-action, multidimensional-hybrid-parallel README); full "
        "recomputation and the Megatron-DeepSpeed TFLOP/s formula (which counts the "
        "recomputed forward) are assumed. GBS ramped from 16 to 2048; the row is the final 2048.",
        tflops_per_gpu=150.0,
        assumed=("zero_stage", "schedule", "recompute", "flops_convention"),
    ),  # fmt: skip
    # NeMo 24.12 H100 FP8 pre-training benchmarks (CP = 1 rows with a preset model).
    _nemo("nemo_24_12_gpt3_175b_128", "gpt3_175b", 128, 256, 1, 2048, 4, 8, 6, 716, 771),
    _nemo("nemo_24_12_gpt3_175b_512", "gpt3_175b", 512, 2048, 2, 2048, 4, 8, 6, 825, 888),
    _nemo("nemo_24_12_llama2_7b_8", "llama2_7b", 8, 128, 1, 4096, 1, 1, 1, 16934, 780),
    _nemo("nemo_24_12_llama2_13b_16", "llama2_13b", 16, 128, 1, 4096, 1, 4, 10, 8715, 760),
    _nemo("nemo_24_12_llama2_70b_64", "llama2_70b", 64, 128, 1, 4096, 4, 4, 20, 1728, 768),
    # NeMo 25.02, "System: DGX-H100" table: the same GPT-3 175B layout as the 24.12 row.
    _nemo(
        "nemo_25_02_gpt3_175b_512",
        "gpt3_175b",
        512,
        2048,
        2,
        2048,
        4,
        8,
        6,
        866,
        932,
        source=_NEMO_25_02,
        notes=_NEMO_25_02_NOTES,
        assumed=_NEMO_ASSUMED[1:],
    ),
)


def published_run(name: str) -> PublishedRun:
    """The row of `PUBLISHED_RUNS` called `name`."""
    for run in PUBLISHED_RUNS:
        if run.name == name:
            return run
    choices = ", ".join(run.name for run in PUBLISHED_RUNS)
    raise ValueError(f"run={name!r}: unknown; choose one of {choices}")


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
    LectureFigure(name="gpt3_gpu_hours", value=3.1e6, unit="GPU-hours",
                  quote="GPT-3 175B | 175,000 (M params) | 3,100,000 (GPU hours)",
                  gpus=1, assumptions=_GPT3),  # fmt: skip
    LectureFigure(name="gpt3_single_gpu_years", value=355, unit="years",
                  quote="a single GPU would take 355 years to finish GPT-3", gpus=1,
                  assumptions=_GPT3),  # fmt: skip
    LectureFigure(name="resnet50_gpu_hours", value=31, unit="GPU-hours",
                  quote="ResNet-50 | 26 (M params) | 31 (GPU hours), measured on A100", gpus=1,
                  assumptions=("lambdalabs.com/blog/demystifying-gpt-3 as cited",)),  # fmt: skip
    LectureFigure(name="ten_gpu_days_on_1024", value=14, unit="minutes",
                  quote="If a training takes 10 GPU days ... 1024 GPUs can finish in 14 "
                  "minutes (ideally)", gpus=1024,
                  assumptions=("linear scaling: 10·24·60 / 1024 = 14.06 min",)),  # fmt: skip
    LectureFigure(name="tsm_summit_1_node", value=49 * 60 + 50, unit="minutes",
                  quote="1 SUMMIT Nodes (6 GPUs) | 49h 50min | 74.1%", gpus=6,
                  assumptions=_TSM),  # fmt: skip
    LectureFigure(name="tsm_summit_128_nodes", value=28, unit="minutes",
                  quote="128 SUMMIT Nodes (768 GPUs) | 28min | 74.1%", gpus=768,
                  assumptions=_TSM),  # fmt: skip
    LectureFigure(name="tsm_summit_256_nodes", value=14, unit="minutes",
                  quote="256 SUMMIT Nodes (1536 GPUs) | 14min (211x) | 74.0%", gpus=1536,
                  assumptions=_TSM + ("211x = 2990 min / 14.2 min: the 14 min is rounded",)),
)  # fmt: skip
