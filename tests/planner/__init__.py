"""Tests of `impls.planner`."""
