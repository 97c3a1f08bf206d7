"""The plan space: every ParallelPlan of a model on `gpus` devices for one global batch
(`plan_space`, which lists the axes and the rules that bound them, each with its source).
"""

from __future__ import annotations

from collections.abc import Iterator

from impls.costmodel.compute import RECOMPUTE, TransformerSpec
from impls.costmodel.hardware import Hardware
from impls.models._checks import divisors
from impls.pipeline.schedules import INTERLEAVED
from impls.simulator import PLANNER_SCHEDULES, SEQUENCE_PARALLEL, ParallelPlan

__all__ = ["FIXED_KEYS", "plan_space"]

FIXED_KEYS = (
    "dp",
    "tp",
    "pp",
    "sp",
    "zero_stage",
    "microbatch_size",
    "schedule",
    "virtual_stages",
    "recompute",
)
_COUNTS = ("dp", "tp", "pp", "microbatch_size", "virtual_stages")
_CHOICES = {
    "sp": SEQUENCE_PARALLEL,
    "schedule": PLANNER_SCHEDULES,
    "recompute": RECOMPUTE,
    "zero_stage": (0, 1, 2, 3),
}


def _check_fixed(fixed: dict) -> None:
    for key, value in fixed.items():
        if key not in FIXED_KEYS:
            raise ValueError(f"fixed[{key!r}]: unknown axis; choose from {', '.join(FIXED_KEYS)}")
        if key in _COUNTS and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{key}={value!r}: must be an integer ≥ 1")
        if key in _CHOICES and (isinstance(value, bool) or value not in _CHOICES[key]):
            allowed = ", ".join(str(c) for c in _CHOICES[key])
            raise ValueError(f"{key}={value!r}: allowed values {allowed}")


def _check_cps(spec: TransformerSpec, cps: tuple) -> None:
    if not isinstance(cps, tuple | list) or not cps:
        raise ValueError(f"cps={cps!r}: give a non-empty tuple of context-parallel degrees")
    for cp in cps:
        if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1:
            raise ValueError(f"cps={tuple(cps)!r}: cp={cp!r} must be an integer ≥ 1")
        if spec.seq_len % cp:
            raise ValueError(f"cps={tuple(cps)!r}: cp={cp} must divide seq_len={spec.seq_len}")


def _check_request(
    spec: TransformerSpec,
    hw: Hardware,
    gpus: int,
    global_batch: int,
    fixed: dict,
    allow_cross_node_tp: bool,
) -> None:
    """Refusals that have one clear cause, named before anything is enumerated."""
    for key, value in (("gpus", gpus), ("global_batch", global_batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key}={value!r}: must be an integer ≥ 1")
    _check_fixed(fixed)
    product = 1
    for key in ("dp", "tp", "pp"):
        product *= fixed.get(key, 1)
    if gpus % product:
        pinned = " · ".join(f"{k}={fixed[k]}" for k in ("dp", "tp", "pp") if k in fixed)
        raise ValueError(f"gpus={gpus}: not divisible by the fixed {pinned} = {product}")
    tp = fixed.get("tp")
    if tp is not None:
        if spec.n_heads % tp:
            raise ValueError(f"tp={tp}: must divide n_heads={spec.n_heads}")
        if spec.kv_heads is not None and spec.kv_heads % tp:
            raise ValueError(f"tp={tp}: must divide kv_heads={spec.kv_heads}")
        if tp > hw.devices_per_node and not allow_cross_node_tp:
            raise ValueError(
                f"tp={tp}: exceeds the {hw.devices_per_node} GPUs per node of "
                f"{hw.name} (pass allow_cross_node_tp=True to allow it)"
            )
    pp = fixed.get("pp")
    if pp is not None and pp > spec.n_layers:
        raise ValueError(f"pp={pp}: exceeds n_layers={spec.n_layers}")
    dp = fixed.get("dp")
    if dp is not None and global_batch % dp:
        raise ValueError(f"dp={dp}: must divide global_batch={global_batch}")


def _tp_degrees(spec: TransformerSpec, hw: Hardware, gpus: int, allow_cross_node_tp: bool):
    for tp in divisors(gpus):
        if spec.n_heads % tp or (spec.kv_heads is not None and spec.kv_heads % tp):
            continue
        if tp > hw.devices_per_node and not allow_cross_node_tp:
            continue
        yield tp


def _schedules(pp: int, microbatches: int, n_layers: int, fixed: dict):
    """(schedule, virtual_stages) pairs a (pp, M) takes."""
    if pp == 1:
        yield "1f1b", 1
        return
    for name in PLANNER_SCHEDULES:
        if name not in INTERLEAVED:
            yield name, 1
        elif microbatches % pp == 0:
            if "virtual_stages" in fixed:
                chunks = [fixed["virtual_stages"]] if fixed["virtual_stages"] >= 2 else []
            else:
                chunks = [2**k for k in range(1, n_layers.bit_length())]
            yield from ((name, v) for v in chunks if pp * v <= n_layers)


def _enumerate(
    spec, hw, gpus, global_batch, fixed, allow_cross_node_tp, cps=(1,)
) -> Iterator[ParallelPlan]:
    for cp in cps:
        if gpus % cp == 0:
            yield from _enumerate_cp(spec, hw, gpus, global_batch, fixed, allow_cross_node_tp, cp)


def _enumerate_cp(
    spec, hw, gpus, global_batch, fixed, allow_cross_node_tp, cp
) -> Iterator[ParallelPlan]:
    def pinned(key, values):
        return [v for v in values if key not in fixed or fixed[key] == v]

    local = spec.seq_len // cp
    for tp in pinned("tp", list(_tp_degrees(spec, hw, gpus // cp, allow_cross_node_tp))):
        sps = ["none"] + (["megatron_sp", "ulysses"] if tp > 1 and local % tp == 0 else [])
        for pp in pinned("pp", [p for p in divisors(gpus // (cp * tp)) if p <= spec.n_layers]):
            dp = gpus // (cp * tp * pp)
            if "dp" in fixed and fixed["dp"] != dp or global_batch % dp:
                continue
            per_replica = global_batch // dp
            sizes = [2**k for k in range(per_replica.bit_length()) if per_replica % 2**k == 0]
            if "microbatch_size" in fixed:
                b = fixed["microbatch_size"]
                sizes = [b] if per_replica % b == 0 else []
            for b in sizes:
                m = per_replica // b
                for schedule, v in _schedules(pp, m, spec.n_layers, fixed):
                    if "schedule" in fixed and fixed["schedule"] != schedule:
                        continue
                    if "virtual_stages" in fixed and fixed["virtual_stages"] != v:
                        continue
                    for sp in pinned("sp", sps):
                        for zero in pinned("zero_stage", (0, 1, 2, 3) if dp > 1 else (0,)):
                            for recompute in pinned("recompute", RECOMPUTE):
                                yield ParallelPlan(
                                    dp=dp,
                                    tp=tp,
                                    pp=pp,
                                    cp=cp,
                                    sp=sp,
                                    zero_stage=zero,
                                    microbatch_size=b,
                                    num_microbatches=m,
                                    schedule=schedule,
                                    virtual_stages=v,
                                    recompute=recompute,
                                )


def plan_space(
    spec: TransformerSpec,
    hw: Hardware,
    *,
    gpus: int,
    global_batch: int,
    fixed: dict | None = None,
    allow_cross_node_tp: bool = False,
    cps: tuple[int, ...] = (1,),
) -> list[ParallelPlan]:
    """Every plan of the space, `fixed` axes pinned, for each context-parallel degree of
    `cps`.

    Axes and the rules that bound them:
    - dp · cp · tp · pp = gpus; cp (context parallelism, ring attention) only from `cps`, the
      degrees the caller asks for (1 alone by default, so a search without it is unchanged),
      each dividing seq_len.
    - tp divides n_heads and kv_heads (Megatron shards attention by heads, Shoeybi et al. 2019
      §3), and stays inside a node (≤ devices_per_node, Narayanan et al. 2021 §3.3: tensor
      parallelism across nodes is too slow) unless `allow_cross_node_tp`.
    - pp ≤ n_layers.
    - sp: `none`; with tp > 1 also `megatron_sp` (Korthikanti et al. 2022 §4.2.2) and `ulysses`
      (Jacobs et al. 2023; the tp axis used as the sequence group), both needing
      tp | seq_len/cp.
    - zero_stage 0–3 over the dp group; with dp = 1 ZeRO shards nothing, so only stage 0 is
      listed (the others are the same plan). ZeRO-2/3 with pp > 1 are listed although
      Megatron-LM's distributed optimizer stops at stage 1 and DeepSpeed refuses stages 2/3
      with its pipeline engine: the simulator prices them as gradient / weight re-gathers per
      micro-batch, which is what an implementation that allowed them would pay.
    - microbatch_size b: powers of two dividing global_batch / dp; num_microbatches
      M = global_batch / (dp · b).
    - schedule: with pp = 1 only `1f1b` (M micro-batches of gradient accumulation: every
      schedule is the same plan); with pp > 1 every schedule whose spec opts in
      (`PLANNER_SCHEDULES`: gpipe, 1f1b, interleaved_1f1b, zero_bubble_h1), an interleaved one
      with virtual_stages V ∈ {2, 4, 8, …}, pp · V ≤ n_layers and M a multiple of pp (what
      `impls.pipeline.schedules.interleaved_1f1b` requires).
    - recompute: none, selective, full (Korthikanti et al. 2022 §4.2).

    `fixed` pins any axis: keys dp, tp, pp, sp, zero_stage, microbatch_size, schedule,
    virtual_stages, recompute (a pinned V need not be a power of two).

    ValueError names the key when a fixed value, the GPU count or the model leaves no plan.
    """
    fixed = dict(fixed or {})
    _check_request(spec, hw, gpus, global_batch, fixed, allow_cross_node_tp)
    _check_cps(spec, cps)
    plans = list(_enumerate(spec, hw, gpus, global_batch, fixed, allow_cross_node_tp, cps))
    if plans:
        return plans
    # name the pinned axis that empties the space on its own, else the model / GPU count
    for key, value in fixed.items():
        if not any(
            True
            for _ in _enumerate(
                spec, hw, gpus, global_batch, {key: value}, allow_cross_node_tp, cps
            )
        ):
            raise ValueError(
                f"{key}={value!r}: no plan of {spec.n_layers} layers, "
                f"{spec.n_heads} heads on gpus={gpus} with "
                f"global_batch={global_batch} takes it"
            )
    if fixed:
        pins = ", ".join(f"{k}={v!r}" for k, v in fixed.items())
        raise ValueError(f"fixed {pins}: no plan takes these axes together")
    raise ValueError(
        f"gpus={gpus}: no dp · tp · pp split fits n_heads={spec.n_heads} "
        f"(tp ≤ {hw.devices_per_node} per node), n_layers={spec.n_layers} "
        f"and global_batch={global_batch}"
    )
