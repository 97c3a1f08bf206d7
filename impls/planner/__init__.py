"""The planner: search the DP × TP × PP × SP × ZeRO × schedule × recompute space of a
transformer on a cluster with `impls.simulator`, and Alpa's stage slicing.

`search` ranks the plans of `plan_space` by predicted tokens/s (equal slicing, and Alpa's
cut for pipelines), screening with bounds that never exceed the simulator's prediction
(`bounds`); `alpa_stage_slicing` is Alpa's inter-operator pass (Zheng et al. 2022 §5).
"""

from impls.planner.search import LOSERS_KEPT, Candidate, SearchResult, alpa_candidate, search
from impls.planner.slicing import alpa_chain_slicing, alpa_stage_slicing, pipeline_objective
from impls.planner.space import FIXED_KEYS, plan_space

__all__ = [
    "FIXED_KEYS",
    "LOSERS_KEPT",
    "Candidate",
    "SearchResult",
    "alpa_candidate",
    "alpa_chain_slicing",
    "alpa_stage_slicing",
    "pipeline_objective",
    "plan_space",
    "search",
]
