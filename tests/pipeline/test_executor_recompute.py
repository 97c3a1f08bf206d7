"""Activation recomputation composes with every pipeline schedule.

`GPTConfig.recompute` (selective: the attention core; full: each block from its input,
Korthikanti et al. 2022) changes what a stage saves for its backward, and the executor
holds those saved tensors across other micro-batches' actions, splits the backward into
I and W for the zero-bubble schedules and places ZB-V's chunks in a V. A failure here means
a recomputed forward saw another micro-batch's state or a split backward lost a weight
gradient under recomputation: the step would no longer train the single-process model.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from impls.pipeline import SCHEDULES
from tests.pipeline.executor_ranks import Case, run_steps
from tests.pipeline.test_executor import _case_id, _check_against_reference


def _case(schedule: str, recompute: str) -> Case:
    if schedule == "naive":
        return Case(schedule, 2, 1, recompute=recompute)
    if schedule == "interleaved_1f1b":
        return Case(schedule, 2, 4, 2, recompute=recompute)
    if schedule == "zero_bubble_v":
        return Case(schedule, 2, 4, 2, n_layers=4, recompute=recompute)
    return Case(schedule, 2, 4, recompute=recompute)


CASES = [_case(s, r) for s in SCHEDULES for r in ("selective", "full")]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{_case_id(c)}-{c.recompute}")
def test_every_schedule_under_recomputation_equals_one_process(ranks8, case: Case) -> None:
    outputs = [out for out in ranks8.run(run_steps, case) if out is not None]
    assert len(outputs) == case.stages
    # against the model without recomputation: the mode must change memory, not the math
    _check_against_reference(outputs, replace(case, recompute="none"))
    assert all(out["results"][0].peak_activation_bytes > 0 for out in outputs)
