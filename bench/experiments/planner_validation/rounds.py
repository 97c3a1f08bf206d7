"""The reference rounds of `planner_validation`'s calibration: every configuration of the
reference GPT that the calibration fits or reads, timed in turns on this one process.

`reference_rounds` times, in each round, the reference per (dtype, micro-batch) of
`REFERENCE_MICRO`, the host probe's step (`PROBE`) and each runtime of `RUNTIMES`
(paired with a plain step right after it), each for a window, in the round's order of
a balanced design (`impls.pairing.balanced_orders`: over each 14 rounds of the seven
configurations, each runs in every position and right after every other equally
often). This host drifts between fast and slow phases lasting seconds; spread over
rounds, each configuration's samples see the same phases, and a phase that lands on one
of them cannot tilt the fit alone.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import partial

from bench.kit.host import PROBE_MICRO
from bench.kit.workloads import REFERENCE_GPT, reference_step
from impls.pairing import turns

__all__ = [
    "JITTER",
    "PROBE",
    "REFERENCE",
    "REFERENCE_MICRO",
    "RUNTIMES",
    "reference_rounds",
    "runtime_step",
]

REFERENCE = REFERENCE_GPT
"""The reference GPT timed on one process (none of the ground-truth shapes)."""
REFERENCE_MICRO = (1, 16)
RUNTIMES = ("executor", "ledger")
"""The runtimes the ground-truth sources step under, each timed among the reference rounds
at micro-batch `REFERENCE_MICRO[0]`: `executor`, the whole reference as the one stage of a
one-rank `impls.pipeline.PipelineExecutor` (`EXECUTOR_MICROBATCHES` micro-batches a step,
timed per micro-batch: its schedule walk and the saved-activation accounting it keeps,
`parallelism_comparison` and `pipeline_utilization`); `ledger`, the reference's forward
under `impls.memory.MemoryLedger.saved_activations` (what `impls.zero.ZeroDataParallel`
wraps every forward in, `zero_memory`)."""
EXECUTOR_MICROBATCHES = 4
JITTER = ("fp32", REFERENCE_MICRO[0])
"""The reference configuration whose step-to-step spread prices stragglers (`straggler`)."""
PROBE = ("fp32", PROBE_MICRO)
"""The host probe's step (`bench.kit.host.host_probe`: the reference in fp32 at
`PROBE_MICRO`), timed among the reference rounds: its median over them is where this
run's host stood while it calibrated."""

Config = tuple[str, int]
"""(dtype or runtime, micro-batch)."""


def reference_rounds(rounds: int, window_s: float) -> tuple[dict[Config, list[float]], list[float]]:
    """(samples, jitter). Samples: every step time of the reference per (dtype,
    micro-batch) and of the host probe's step (`PROBE`), and per runtime of `RUNTIMES`
    (key `(runtime, b)`) the excess of its step (per micro-batch) over the plain
    reference's at the same b timed right after it, all in `rounds` rounds: in each, every
    configuration samples for `window_s` seconds (at least once), in the round's balanced
    order. A runtime costs a few percent of a step, less than the host's drift: paired
    back to back, the drift cancels in each difference. Jitter: each step of `JITTER` ÷
    the median of its window (the step-to-step spread, the phases divided out)."""
    configs: list[Config] = [
        (dtype, micro) for dtype in ("fp32", "bf16") for micro in REFERENCE_MICRO
    ]
    configs.append(PROBE)
    steps = {config: reference_step(config[1], config[0]) for config in configs}
    runtimes = {
        (name, REFERENCE_MICRO[0]): runtime_step(name, REFERENCE_MICRO[0]) for name in RUNTIMES
    }
    for step in [*steps.values(), *(step for step, _ in runtimes.values())]:
        step()  # warm-up
    sample = {config: partial(_seconds, step) for config, step in steps.items()}
    plain = steps[JITTER]
    for config, (step, per) in runtimes.items():
        sample[config] = partial(_excess, step, per, plain)
    configs += list(runtimes)
    samples: dict[Config, list[float]] = {config: [] for config in configs}
    jitter: list[float] = []
    for _, i in turns(len(configs), rounds):
        config = configs[i]
        window, end = [], time.perf_counter() + window_s
        while True:
            window.append(sample[config]())
            if time.perf_counter() >= end:
                break
        samples[config] += window
        if config == JITTER:
            middle = statistics.median(window)
            jitter += [t / middle for t in window]
    return samples, jitter


def _seconds(step: Callable[[], None]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def _excess(step: Callable[[], None], per: int, plain: Callable[[], None]) -> float:
    """`step`'s seconds ÷ `per` less `plain`'s, timed back to back."""
    return _seconds(step) / per - _seconds(plain)


def runtime_step(runtime: str, micro: int) -> tuple[Callable[[], None], int]:
    """(step, micro-batches per step): one step of the reference as a source's `runtime`
    runs it (`RUNTIMES`), then zero_grad as the plain reference step does. `executor`
    needs this process's one-rank process group (a planner_validation rank has it)."""
    from bench.kit.workloads import lm_loss, seeded_gpt_and_batch
    from impls.comm import Communicator
    from impls.memory import MemoryLedger
    from impls.pipeline import PipelineExecutor, build_plan

    m = EXECUTOR_MICROBATCHES if runtime == "executor" else 1
    net, inputs, targets = seeded_gpt_and_batch(REFERENCE, micro * m, seed=0)
    if runtime == "ledger":
        ledger, weights = MemoryLedger(), list(net.parameters())

        def step() -> None:
            with ledger.saved_activations(exclude=weights):
                loss = net.loss(net(inputs).float(), targets)
            loss.backward()
            net.zero_grad(set_to_none=False)

        return step, m
    shape = (micro, REFERENCE["seq_len"], REFERENCE["d_model"])
    executor = PipelineExecutor(
        Communicator(),
        {0: net},
        build_plan("gpipe", 1, m),
        num_stages=1,
        microbatches=m,
        loss_fn=lm_loss,
        activation_shape=shape,
    )

    def executor_step() -> None:
        executor.step(inputs, targets, align_clocks=False)
        net.zero_grad(set_to_none=False)

    return executor_step, m
