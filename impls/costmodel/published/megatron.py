"""Published runs of the Megatron-LM family: Megatron-LM SC'21 Table 1, the Megatron-LM
README's MFU table, BLOOM 176B (Megatron-DeepSpeed) and NVIDIA NeMo's benchmark tables.

Every number below was read in the cited source (paper table, README or documentation
page). Where a layout detail is not published, the row still needs a value for the
simulator; such fields are named in the row's `assumed` tuple and explained in `notes`.
Megatron-LM and NeMo runs with pp > 1 use Megatron's pipeline layout (`layout="megatron"`);
BLOOM's Megatron-DeepSpeed partition is the even slicing of L + 2 layers (its notes).
"""

from __future__ import annotations

from impls.costmodel.published.schema import PublishedRun, published_plan

__all__ = ["MEGATRON_RUNS"]

_SC21 = "Narayanan et al. 2021, 'Efficient Large-Scale Language Model Training on GPU "
_SC21 += "Clusters Using Megatron-LM' (SC'21, arXiv 2104.04473), Table 1"
_SC21_NOTES = (
    "Selene, DGX A100 80GB nodes (8 GPUs); TFLOP/s and % of peak (312 TFLOP/s 16-bit) as "
    "Table 1 states them, counted with full activation recomputation (hfu = % of peak). "
    "Table 1 gives no micro-batch size or schedule: microbatch_size 1 and non-interleaved "
    "1F1B are our choices; 16-bit precision follows from the % of the 312 TFLOP/s peak."
)
_SC21_ASSUMED = ("microbatch_size", "schedule", "virtual_stages", "dtype")


def _sc21(
    size: str, model: str, tp: int, pp: int, gpus: int, batch: int, tflops: float, peak_pct: float
) -> PublishedRun:
    return PublishedRun(
        name=f"megatron_sc21_{size}",
        model=model,
        hardware="a100_80gb",
        gpus_per_node=8,
        plan=published_plan(
            gpus=gpus,
            dp=gpus // (tp * pp),
            tp=tp,
            pp=pp,
            sp="none",
            zero_stage=0,
            microbatch_size=1,
            global_batch=batch,
            schedule="1f1b",
            virtual_stages=1,
            recompute="full",
        ),
        seq_len=2048,
        dtype="fp16",
        flops_convention="hardware_full_recompute",
        source=_SC21,
        origin="megatron_sc21",
        notes=_SC21_NOTES,
        tflops_per_gpu=tflops,
        hfu=peak_pct / 100,
        layout="megatron" if pp > 1 else "equal",
        assumed=_SC21_ASSUMED,
    )


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
_README_ASSUMED = (
    "gpus",
    "tp",
    "pp",
    "microbatch_size",
    "global_batch",
    "schedule",
    "virtual_stages",
    "dtype",
    "sp",
    "recompute",
)


def _korthikanti(
    size: str, model: str, pp: int, batch: int, mfu: float, hfu: float
) -> PublishedRun:
    return PublishedRun(
        name=f"megatron_readme_{size}",
        model=model,
        hardware="a100_80gb",
        gpus_per_node=8,
        plan=published_plan(
            gpus=8 * pp,
            dp=1,
            tp=8,
            pp=pp,
            sp="megatron_sp",
            zero_stage=0,
            microbatch_size=1,
            global_batch=batch,
            schedule="1f1b",
            virtual_stages=1,
            recompute="selective",
        ),
        seq_len=2048,
        dtype="bf16",
        flops_convention="model",
        source=_README_MFU,
        origin="megatron_readme",
        notes=_README_NOTES,
        mfu=mfu,
        hfu=hfu,
        layout="megatron" if pp > 1 else "equal",
        assumed=_README_ASSUMED,
    )


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
_NEMO_ATTENTION = (
    " attention='flash': NeMo runs attention through Transformer Engine, where 'by default, "
    "Flash Attention is enabled' (NVIDIA/NeMo docs, memory_optimizations.rst, PR #9188); "
    "the benchmark tables do not restate it. layout='megatron': NeMo trains with "
    "Megatron-Core's pipeline stages."
)
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


_NEMO_24_07 = (
    "NVIDIA/NeMo docs/source/performance/performance_summary.md (commit 070a0bb), "
    "'Pretraining' at FP8, 'Container: NeMo24.07', 'System: DGX-H100': Model, #-GPUs, GBS, "
    "MBS, Sequence Length, TP, PP, CP, VP, Tokens / sec / GPU, Model TFLOP / sec / GPU"
)
_NEMO_24_07_NOTES = (
    "DGX H100 and FP8 stated by the page; CP is Megatron-Core's context parallelism (ring "
    "attention over the CP group), so dp = GPUs / (TP·PP·CP). Sequence parallelism, ZeRO-1 "
    "(distributed optimizer) and no recomputation are assumed as for the other NeMo rows."
)


def _nemo(
    name: str,
    model: str,
    gpus: int,
    gbs: int,
    mbs: int,
    seq: int,
    tp: int,
    pp: int,
    vp: int,
    tokens: float,
    tflops: float,
    *,
    cp: int = 1,
    source: str = _NEMO,
    notes: str = _NEMO_NOTES,
    assumed: tuple[str, ...] = _NEMO_ASSUMED,
) -> PublishedRun:
    return PublishedRun(
        name=name,
        model=model,
        hardware="h100_sxm",
        gpus_per_node=8,
        plan=published_plan(
            gpus=gpus,
            dp=gpus // (tp * pp * cp),
            tp=tp,
            pp=pp,
            cp=cp,
            sp="megatron_sp" if tp > 1 else "none",
            zero_stage=1,
            microbatch_size=mbs,
            global_batch=gbs,
            schedule="interleaved_1f1b" if vp > 1 else "1f1b",
            virtual_stages=vp,
            recompute="none",
        ),
        seq_len=seq,
        dtype="fp8",
        flops_convention="model",
        source=source,
        origin="nemo",
        notes=notes + _NEMO_ATTENTION,
        tflops_per_gpu=tflops,
        tokens_per_s_per_gpu=tokens,
        attention="flash",
        layout="megatron" if pp > 1 else "equal",
        assumed=assumed,
    )


MEGATRON_RUNS: tuple[PublishedRun, ...] = (
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
        gpus_per_node=8,
        plan=published_plan(
            gpus=384,
            dp=8,
            tp=4,
            pp=12,
            sp="none",
            zero_stage=1,
            microbatch_size=2,
            global_batch=2048,
            schedule="1f1b",
            virtual_stages=1,
            recompute="full",
        ),
        seq_len=2048,
        dtype="bf16",
        flops_convention="hardware_full_recompute",
        source="bigscience-workshop/bigscience train/tr11-176B-ml/README.md ('Global batch "
        "size': 384 GPUs, TP=4, PP=12, DP=8, MBS=2, GBS=2048, SEQ_LEN=2048); BigScience "
        "176B model page ('training throughput: about 150 TFLOPs', 384 A100 80GB); Le Scao "
        "et al. 2022 (arXiv 2211.05100), training setup: bf16, 48 nodes of 8 A100 80GB",
        notes="150 TFLOP/s is 'about'. The tr11 README states the rest: activation "
        "check-pointing, with throughput counted as hardware TFLOPs ('the 4*2 co-efficient "
        "instead of the 3*2'), bf16, and DeepSpeed's BF16_Optimizer 'implements its own ZeRO "
        "Stage 1'. layout='equal': '--pp-partition-method type:transformer|embedding' gives pp "
        "rank 0 [embed | 5 blocks], ranks 1-10 six blocks, rank 11 [5 blocks | embed], i.e. "
        "L + 2 = 72 layers sliced evenly over 12 stages, not Megatron's L/pp layout. The "
        "schedule (Megatron-DeepSpeed's 1F1B) is not stated. GBS ramped from 16 (later 192) "
        "to 2048; the row is the final 2048 at MBS 2.",
        origin="bigscience",
        tflops_per_gpu=150.0,
        layout="equal",
        assumed=("schedule",),
    ),
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
    # NeMo 24.07, DGX-H100: the two rows with context parallelism (CP = 2 at s = 8192).
    _nemo(
        "nemo_24_07_llama3_8b_8",
        "llama3_8b",
        8,
        128,
        1,
        8192,
        1,
        1,
        1,
        12036,
        697,
        cp=2,
        source=_NEMO_24_07,
        notes=_NEMO_24_07_NOTES,
        assumed=_NEMO_ASSUMED[1:],
    ),
    _nemo(
        "nemo_24_07_llama3_70b_64",
        "llama3_70b",
        64,
        128,
        1,
        8192,
        4,
        4,
        5,
        1533,
        738,
        cp=2,
        source=_NEMO_24_07,
        notes=_NEMO_24_07_NOTES,
        assumed=_NEMO_ASSUMED[1:],
    ),
)
