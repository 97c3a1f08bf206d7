"""One pool call trains every data-parallel case; the tests read its results."""

from __future__ import annotations

import pytest

from tests.data_parallel.cases import ALL_CASES
from tests.data_parallel.dp_ranks import Case, run_cases


@pytest.fixture(scope="session")
def dp_results(ranks8) -> dict[Case, list[dict]]:
    """Per case, the output of each of its N ranks (rank order)."""
    per_rank = ranks8.run(run_cases, ALL_CASES)
    return {
        case: [out[i] for out in per_rank if out[i] is not None] for i, case in enumerate(ALL_CASES)
    }
