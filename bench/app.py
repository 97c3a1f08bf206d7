"""`python -m bench experiment=NAME [key=value ...]`: the Hydra entry point.

The composed config holds the run-level keys (`bench.config.RunConfig`: report_dir, resume,
append, cluster, wandb, profile) and the experiment's own keys. Both are typed, so Hydra
refuses a value of the wrong type naming the key, and both are checked before any process
starts, with what this host can hold (`cluster=local`) and what `cluster=torchrun` needs.
A refused config — or a report_dir the runner's preflight refuses — is one line,
`bad config: ...`, exit status 2.

After a grid, one line: `<experiment>: N ok, N failed, N wrong -> <report_dir>`; the exit
status is 1 if any cell failed, timed out or was wrong, else 0 (as pytest and torchrun do).
In a multirun sweep every job runs and prints its line; a job that was refused or had a
failed cell fails the sweep (exit status 1, Hydra naming the job's overrides). A SLURM job
requeued after its time limit or a preemption resumes its grid (`resume=true`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from bench.config import (
    RUN_KEYS,
    ClusterConfig,
    RunConfig,
    check_host,
    check_overrides,
    parse_run,
)
from bench.experiments import Experiment, experiments
from bench.presets import follow_preset

__all__ = ["JobFailed", "Plan", "build", "check_launch", "job_restarted", "main", "summary"]

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = str(REPO_ROOT / "experiments")
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
log = logging.getLogger("bench")


class JobFailed(CompactHydraException):
    """A multirun job that was refused or had failed cells: Hydra prints the one line and
    fails the sweep once every job has run."""


@dataclass(frozen=True)
class Plan:
    """A checked run: the experiment, its typed config, where it reports, the run keys."""

    experiment: Experiment
    cfg: Any
    report_dir: Path
    run: RunConfig


def build(cfg: DictConfig, name: str | None = None) -> Plan:
    """Check the composed config (experiment `name`; default: Hydra's choice) and split it
    into a `Plan`; a ValueError names the key that cannot work."""
    name = name or HydraConfig.get().runtime.choices.get("experiment")
    known = experiments()
    if name not in known:
        allowed = ", ".join(known)
        raise ValueError(f"experiment={name!r} is unknown; allowed values: {allowed}")
    overrides = _overrides(cfg)
    check_overrides(known[name].schema, overrides)
    check_overrides(RunConfig, overrides)
    OmegaConf.set_readonly(cfg, True)
    own = [key for key in cfg if key != "hydra"]  # hydra: composed with return_hydra_config
    values = OmegaConf.to_container(OmegaConf.masked_copy(cfg, own), resolve=True)
    follow_preset(values, _choices(cfg), name)
    run = parse_run({key: values.pop(key, None) for key in RUN_KEYS})
    experiment = known[name]
    typed = experiment.parse(values)
    check_launch(typed, run.cluster)
    report_dir = Path(run.report_dir) if run.report_dir else REPO_ROOT / "reports" / name
    return Plan(experiment=experiment, cfg=typed, report_dir=report_dir, run=run)


def _overrides(cfg: DictConfig) -> list[str]:
    """The command line's overrides, as typed (from the `hydra` node where the config was
    composed with it, else from the running app's)."""
    if "hydra" in cfg:
        return list(cfg.hydra.overrides.task)
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def _choices(cfg: DictConfig) -> dict[str, Any]:
    """The config groups' chosen options: from the `hydra` node where the config was
    composed with it, else from the running app's."""
    if "hydra" in cfg:
        return dict(cfg.hydra.runtime.choices)
    return dict(HydraConfig.get().runtime.choices) if HydraConfig.initialized() else {}


def check_launch(typed: Any, cluster: ClusterConfig) -> None:
    """What the cluster kind needs of this process: torchrun's environment, CUDA for nccl,
    and, where this process spawns the ranks, a grid the host can hold."""
    if cluster.kind == "torchrun":
        missing = [name for name in TORCHRUN_ENV if name not in os.environ]
        if missing:
            raise ValueError(
                f"cluster=torchrun, but {', '.join(missing)} {'is' if len(missing) == 1 else 'are'}"
                " not set: this process is not a rank of torchrun; run `torchrun "
                "--nproc-per-node=N -m bench ... cluster=torchrun`, or use cluster=local"
            )
    if cluster.backend == "nccl":
        import torch

        if not torch.cuda.is_available():
            raise ValueError(
                "cluster.backend=nccl needs CUDA, which this host does not have; "
                "allowed here: gloo, auto"
            )
    if _spawns_ranks(cluster):
        check_host(typed, cluster)


def _spawns_ranks(cluster: ClusterConfig) -> bool:
    """Whether this process spawns the cells' ranks: cluster=local, a SLURM job of one task,
    or cluster=slurm outside a job and outside an env:// launch (a run without --multirun:
    Hydra's launcher submits only sweeps, so the grid runs here, under the host's limits)."""
    if cluster.kind != "slurm":
        return cluster.kind == "local"
    job = _submitit_job()
    if job is None:
        return not ("RANK" in os.environ and "WORLD_SIZE" in os.environ)
    return job.num_tasks == 1


def _submitit_job() -> Any:
    """submitit's view of the job this process runs in, or None outside one."""
    try:
        import submitit

        return submitit.JobEnvironment()
    except (ImportError, RuntimeError, KeyError):
        return None


def job_restarted() -> bool:
    """Whether this SLURM job (or submitit's local stand-in) runs again after a requeue:
    SLURM counts restarts; submitit's local executor reruns the same job id, so each task
    leaves a marker beside the job's logs on its first run."""
    if int(os.environ.get("SLURM_RESTART_COUNT") or 0) > 0:
        return True
    job = _submitit_job()
    if job is None:
        return False
    marker = job.paths.folder / f"{job.job_id}_{job.global_rank}_started"
    restarted = marker.exists()
    marker.touch()
    return restarted


def summary(name: str, df: Any, report_dir: Path) -> tuple[str, bool]:
    """(the run's one line, whether every cell was ok): a row is wrong when its status says
    so or it has `wrong > 0`; every other row whose status is not ok failed or timed out."""
    import pandas as pd

    status = df["status"] if "status" in df else pd.Series("ok", index=df.index)
    wrong_count = pd.to_numeric(df["wrong"], errors="coerce").fillna(0) if "wrong" in df else 0
    wrong = (status == "wrong") | ((status == "ok") & (wrong_count > 0))
    ok = (status == "ok") & ~wrong
    failed = len(df) - int(ok.sum()) - int(wrong.sum())
    line = f"{name}: {int(ok.sum())} ok, {failed} failed, {int(wrong.sum())} wrong -> {report_dir}"
    return line, bool(ok.all())


def _run(plan: Plan) -> Any:
    from bench.runner import run_experiment  # imported late: keeps a refused config fast

    resume = plan.run.resume
    if plan.run.cluster.kind == "slurm" and job_restarted():
        log.warning("requeued SLURM job: resuming its grid (finished cells are not re-run)")
        resume = True
    return run_experiment(
        plan.experiment,
        plan.cfg,
        report_dir=plan.report_dir,
        cluster=plan.run.cluster,
        resume=resume,
        wandb_cfg=plan.run.wandb,
        append=plan.run.append,
        sweep=_sweep_id(),
    )


def _sweep_id() -> str | None:
    """In a multirun, the id its jobs share (they write one grid into one report_dir, and
    a requeued SLURM job keeps it); None in a single run."""
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return None
    return "sweep-" + hashlib.sha256(str(hydra_cfg.sweep.dir).encode()).hexdigest()[:12]


def _fail(line: str, code: int, *, printed: bool = False) -> NoReturn:
    """Exit with `code` after `line`; in a multirun job, fail the job instead (exiting
    would stop the sweep's other jobs, or lose a submitit job's result)."""
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        raise JobFailed(line)
    if not printed:
        log.error(line)
    sys.exit(code)


def _register_slurm_launcher() -> None:
    """`hydra/launcher=distbench_slurm` (what cluster=slurm uses): submitit's SLURM launcher
    with its time limit, partition and requeue count taken from cluster.*. Kept out of
    cluster/slurm.yaml, so that `hydra/launcher=submitit_local` (no partition, no requeue
    count) can stand in for it on a machine without SLURM."""
    from hydra.core.config_store import ConfigStore
    from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf

    from_cluster = {
        "timeout_min": "${cluster.timeout_min}",
        "partition": "${cluster.partition}",
        "max_num_timeout": "${cluster.requeues}",
    }
    node = OmegaConf.merge(OmegaConf.structured(SlurmQueueConf), from_cluster)
    ConfigStore.instance().store(group="hydra/launcher", name="distbench_slurm", node=node)


# Before Hydra composes a config: every experiment's schema, and the SLURM launcher.
experiments()
_register_slurm_launcher()


@hydra.main(version_base=None, config_path=CONFIG_DIR, config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        plan = build(cfg)
        df = _run(plan)
    except ValueError as err:
        _fail("bad config: " + " ".join(str(err).split()), 2)
    except KeyboardInterrupt:  # before the grid's own handler (`runner.Interrupted`) was set
        _fail("interrupted by SIGINT before any cell ran", 130)
    except OSError as err:  # the file system failed mid-run: a full disk, a read-only mount
        where = f"{err.filename}: " if err.filename else ""
        _fail(
            f"cannot write {where}{(err.strerror or str(err)).lower()}; the rows written before "
            "it are kept (free space or fix the path, then rerun with resume=true)",
            1,
        )
    if os.environ.get("RANK", "0") != "0":
        return  # one rank of torchrun / SLURM tasks: rank 0 reports
    line, all_ok = summary(plan.experiment.name, df, plan.report_dir)
    print(line, flush=True)
    if not all_ok:
        _fail(f"{line} (see the status and error columns of results.csv)", 1, printed=True)
