"""`python -m bench experiment=NAME [key=value ...]`: the Hydra entry point.

The composed config holds run-level keys (report_dir, resume, cluster, wandb, profile)
and the experiment's own keys; the latter are validated by the experiment's typed config
before any process starts, so a bad grid fails fast with the key and allowed values.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from bench.experiments import experiments
from bench.runner import CLUSTER_KINDS
from bench.wandb_log import MODES as WANDB_MODES

RUN_KEYS = ("report_dir", "resume", "cluster", "wandb", "profile")
REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = str(REPO_ROOT / "experiments")


def build(cfg: DictConfig):
    """Split the composed config into (experiment, typed config, run options)."""
    name = HydraConfig.get().runtime.choices.get("experiment")
    known = experiments()
    if name not in known:
        allowed = ", ".join(known)
        raise ValueError(f"experiment={name!r} is unknown; allowed values: {allowed}")
    OmegaConf.set_readonly(cfg, True)
    values = OmegaConf.to_container(cfg, resolve=True)
    run = {key: values.pop(key, None) for key in RUN_KEYS}
    experiment = known[name]
    typed = experiment.parse(values)
    _check_choice("cluster.kind", (run["cluster"] or {}).get("kind", "local"), CLUSTER_KINDS)
    _check_choice("wandb.mode", (run["wandb"] or {}).get("mode", "offline"), WANDB_MODES)
    report_dir = Path(run["report_dir"] or REPO_ROOT / "reports" / name)
    return experiment, typed, report_dir, run


def _check_choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{key}={value!r} is unknown; allowed values: {', '.join(allowed)}")


experiments()  # registers every experiment's schema before Hydra composes a config


@hydra.main(version_base=None, config_path=CONFIG_DIR, config_name="config")
def main(cfg: DictConfig) -> None:
    from bench.runner import run_experiment  # imported late: keeps a refused config fast

    try:
        experiment, typed, report_dir, run = build(cfg)
    except ValueError as err:
        logging.getLogger("bench").error("bad config: %s", err)
        sys.exit(2)
    df = run_experiment(
        experiment,
        typed,
        report_dir=report_dir,
        cluster=run["cluster"] or {},
        resume=bool(run["resume"]),
        wandb_cfg=run["wandb"] or {},
    )
    if len(df):
        failed = int((df["status"] != "ok").sum())
        print(f"{experiment.name}: {len(df)} rows ({failed} failed) -> {report_dir}")
