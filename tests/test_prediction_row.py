"""`prediction_row`, the one place a `Prediction` becomes result columns: the parts add up
to the step time under either naming, and a replaced optimizer time moves the step."""

import pytest

from bench.kit.prediction import STEP_PARTS, prediction_row
from impls.costmodel.published import PUBLISHED_RUNS
from impls.simulator.validation import predict_run


@pytest.fixture(scope="module")
def prediction():
    return predict_run(PUBLISHED_RUNS[0]).prediction


def test_the_parts_add_up_to_the_step_under_both_namings(prediction):
    row = prediction_row(prediction)
    assert list(row)[-len(STEP_PARTS) :] == list(STEP_PARTS.values())
    assert sum(row[name] for name in STEP_PARTS.values()) == pytest.approx(
        row["predicted_step_time_s"]
    )
    short = prediction_row(prediction, parts="predicted_{part}_s", summary=False)
    assert set(short) == {"predicted_step_time_s"} | {f"predicted_{p}_s" for p in STEP_PARTS}
    assert short["predicted_tp_s"] == row["exposed_tp_s"] == prediction.exposed_tp_s


def test_a_replaced_optimizer_time_moves_the_step(prediction):
    row = prediction_row(prediction, optimizer_s=prediction.optimizer_s + 1.0)
    assert row["optimizer_s"] == prediction.optimizer_s + 1.0
    assert row["predicted_step_time_s"] == pytest.approx(prediction.step_time_s + 1.0)
    assert prediction_row(prediction)["predicted_step_time_s"] == prediction.step_time_s
