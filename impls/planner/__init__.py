"""The planner: search the DP × TP × PP × SP × ZeRO × schedule × recompute space of a
transformer on a cluster with `impls.simulator`, and Alpa's stage slicing."""
