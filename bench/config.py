"""Typed configs: one schema per experiment is the single source of defaults, and one
`RunConfig` holds the run-level keys (report_dir, resume, append, wandb, cluster, profile).

Each experiment's schema is a `@dataclass(kw_only=True)` whose fields are its keys (a
docstring under each says what it means) and whose `__post_init__` refuses what cannot
work, naming the key and the allowed values. `register` puts the schema, joined with
`RunConfig`, in Hydra's ConfigStore as `schema/<name>`; `experiments/experiment/<name>.yaml`
starts from it (`defaults: [/schema/<name>, _self_]`) and lists only what differs, so Hydra
itself refuses a value of the wrong type, naming the key — an experiment's key or a
run-level one (`resume=maybe`, `cluster.max_ranks=abc`). `parse_config` turns the composed
values into the schema object (refusing keys the experiment does not have and repeated
grid values) — the typed config the runner hands to every rank; `parse_run` does the same
for the run-level keys. `check_host` refuses a grid whose cells this host cannot hold
(too many ranks, buffers beyond its memory) before any rank starts.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import typing
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, make_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from impls.models import GPTConfig

__all__ = [
    "BATCH_MAX",
    "BYTES_MAX",
    "CLUSTER_KINDS",
    "ITERATIONS_MAX",
    "RANKS_MAX",
    "SEED_MAX",
    "WINDOW_MAX_S",
    "ClusterConfig",
    "RunConfig",
    "WandbConfig",
    "batch_key",
    "bounded",
    "bytes_key",
    "cell_timeout",
    "check_batch_split",
    "check_choice",
    "check_choices",
    "check_directory",
    "check_gpt_model",
    "check_host",
    "check_number",
    "check_overrides",
    "check_positive",
    "check_range",
    "check_training",
    "check_types",
    "check_unique",
    "check_value",
    "gpt_rank_bytes",
    "iterations_key",
    "parse_config",
    "parse_run",
    "range_text",
    "rank_limit",
    "ranks_key",
    "register",
    "seconds_key",
    "seed_key",
]

CLUSTER_KINDS = ("local", "torchrun", "slurm")
BACKENDS = ("auto", "gloo", "nccl")
WANDB_MODES = ("offline", "online", "disabled")
PROFILES = ("full", "ci")
# A rank is a fresh interpreter with torch imported and a gloo group up: 0.22 GB measured
# for `import torch` alone on this project's CPU wheel; 0.4 GB leaves room for the group,
# the kit and the allocator's slack.
RANK_OVERHEAD_BYTES = 400 * 10**6
# Ranks per core `cluster=local` spawns at most: the suite runs 8 ranks on 2 cores (their
# collectives and traffic are exact however oversubscribed; wall clock is labelled).
RANKS_PER_CORE = 4
MIN_RANK_LIMIT = 8


@dataclass(kw_only=True)
class ClusterConfig:
    """Where ranks come from (`cluster=local | torchrun | slurm`) and what they may use."""

    kind: str = "local"
    """local (spawn each cell's ranks here), torchrun (this process is one rank of an
    external torchrun) or slurm (Hydra's submitit launcher)."""
    backend: str = "gloo"
    """gloo, nccl, or auto (nccl where CUDA is available, else gloo); local ranks: gloo."""
    device: str = "cpu"
    """Where each rank computes: cpu, or cuda (one GPU per rank, by its local rank)."""
    max_ranks: int | None = None
    """Most ranks `cluster=local` spawns for one cell; None: derived from the host,
    min(max(8, 4 × cores), available memory / 0.4 GB per rank)."""
    memory_gb: float | None = None
    """Memory (GB) the local ranks of one cell may allocate; None: what the host has
    available now (MemAvailable, capped by the cgroup's limit)."""
    timeout_min: int = 60
    """SLURM: the job's time limit in minutes."""
    partition: str | None = None
    """SLURM: the partition to submit to; None: the cluster's default."""
    requeues: int = 3
    """SLURM: times a job killed at its time limit is requeued (a preempted job always is);
    a requeued job resumes its grid."""

    def __post_init__(self) -> None:
        check_choice("cluster.kind", self.kind, CLUSTER_KINDS)
        local = self.kind == "local"
        why = " (cluster=local spawns CPU ranks on gloo)" if local else ""
        backends = ("auto", "gloo") if local else BACKENDS
        check_choice("cluster.backend", self.backend, backends, why)
        check_choice("cluster.device", self.device, ("cpu",) if local else ("cpu", "cuda"), why)
        if self.max_ranks is not None:
            check_positive("cluster.max_ranks", [self.max_ranks])
        if self.memory_gb is not None:
            check_number("cluster.memory_gb", self.memory_gb)
        check_positive("cluster.timeout_min", [self.timeout_min])
        check_positive("cluster.requeues", [self.requeues], minimum=0)
        if self.partition == "":
            raise ValueError("cluster.partition='': give a partition name, or null")

    def process_group_backend(self, *, spawned: bool) -> str:
        """The backend ranks join with: `auto` is gloo for ranks spawned here (they are CPU
        ranks), and for an external launch's ranks nccl where CUDA is available, else gloo."""
        if self.backend != "auto":
            return self.backend
        if spawned:
            return "gloo"
        import torch

        return "nccl" if torch.cuda.is_available() else "gloo"


@dataclass(kw_only=True)
class WandbConfig:
    mode: str = "offline"
    """offline (runs land in ./wandb), online, or disabled."""
    project: str = "distbench"
    """The wandb project every run of the grid goes to."""
    entity: str | None = None
    """The wandb user or team owning the project; None: the logged-in user's default."""

    def __post_init__(self) -> None:
        check_choice("wandb.mode", self.mode, WANDB_MODES)


@dataclass(kw_only=True)
class ProfileConfig:
    name: str = "full"
    """full, or ci (profile_grid/ci_<experiment>.yaml shrinks the grid)."""

    def __post_init__(self) -> None:
        check_choice("profile.name", self.name, PROFILES, " (pick one with profile=NAME)")


@dataclass(kw_only=True)
class RunConfig:
    """The run-level keys every experiment takes beside its own."""

    report_dir: str | None = None
    """Where results.csv, report.md and the plots go; None: reports/<experiment>."""
    resume: bool = False
    """Skip the cells already recorded as ok with the same settings in results.csv."""
    append: bool = False
    """Keep the rows of earlier grids in results.csv and the report (labelled as earlier);
    false: the report covers the grid just run."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)

    def __post_init__(self) -> None:
        if self.report_dir is not None and not self.report_dir.strip():
            raise ValueError("report_dir='': give a directory, or null for reports/<experiment>")


RUN_KEYS = tuple(f.name for f in fields(RunConfig))


def register(name: str, schema: type) -> None:
    """Make `schema` (with the run-level keys) the base of `experiment/<name>.yaml`."""
    from hydra.core.config_store import ConfigStore

    node = make_dataclass(schema.__name__, [], bases=(schema, RunConfig), kw_only=True)
    ConfigStore.instance().store(group="schema", name=name, node=node, package="_global_")


def check_types(schema: type, values: Mapping[str, Any], prefix: str = "") -> None:
    """Refuse a value that OmegaConf would quietly convert: a bool key takes only true or
    false (not `2`, `yes` or `maybe`), an int key no bool, a float key no NaN or ±inf;
    nested configs are checked by their own schema, each key named in full."""
    hints = typing.get_type_hints(schema)
    for f in fields(schema):
        if f.name not in values or values[f.name] is None:
            continue
        check_value(prefix + f.name, values[f.name], hints[f.name])
        check_range(prefix + f.name, values[f.name], f.metadata)


def bounded(
    default: Any = MISSING,
    *,
    ge: float | None = None,
    le: float | None = None,
    why: str = "",
    default_factory: Any = MISSING,
) -> Any:
    """A schema field that declares its range: `ge` ≤ value ≤ `le` (each item of a list);
    `why` says where the upper bound comes from. `check_types` enforces it before any
    other check, and `--help` shows it."""
    bounds = {"ge": ge, "le": le, "why": why}
    if isinstance(default, list):  # a list default is built afresh for each config
        default, default_factory = MISSING, (lambda items=tuple(default): list(items))
    return field(default=default, default_factory=default_factory, metadata=bounds)


# Upper bounds the schemas' keys share. Past them a value is a typo, or more than one cell
# of one host can hold; where the host itself decides (its cores, its memory) `check_host`
# bounds further, and a key with a tighter limit of its own declares that instead.
ITERATIONS_MAX = 100_000
"""Timed repeats, warm-up calls, training steps, rounds: 10⁵ of even a 1 ms step is
minutes; the grids' own use at most a few hundred."""
SEED_MAX = 2**32 - 1
"""numpy's seed range (torch takes 64 bits; a seed also seeds numpy)."""
WINDOW_MAX_S = 3600.0
"""A timed window or a segment of work: an hour."""
RANKS_MAX = 1024
"""Ranks of one cell (a world size or a parallel degree that makes one): the process
groups this harness starts; `cluster=local` is bounded by the host (`check_host`)."""
BYTES_MAX = 2**34
"""One buffer (a message, a bucket, a copied tensor): 16 GiB, the size of a large host's
memory share; `check_host` compares a grid's largest cell with what is free."""
BATCH_MAX = 2**16
"""Samples in one rank's batch or micro-batch on a CPU host (the activations grow with
it; `check_host` bounds the cell's total)."""


def iterations_key(default: Any, ge: int = 1) -> Any:
    """A count of repeats, steps or rounds (`ITERATIONS_MAX`)."""
    return bounded(default, ge=ge, le=ITERATIONS_MAX, why="more than a cell's time holds")


def seed_key(default: Any = 0) -> Any:
    """A random seed (`SEED_MAX`)."""
    return bounded(default, ge=0, le=SEED_MAX, why="numpy's seed range")


def seconds_key(default: Any, ge: float = 0.0) -> Any:
    """A window or segment of timed work (`WINDOW_MAX_S`)."""
    return bounded(default, ge=ge, le=WINDOW_MAX_S, why="an hour")


def ranks_key(default: Any, ge: int = 1) -> Any:
    """A world size or parallel degree of one cell (`RANKS_MAX`)."""
    return bounded(default, ge=ge, le=RANKS_MAX, why="the ranks one cell starts")


def bytes_key(default: Any, ge: int = 1) -> Any:
    """Bytes of one buffer (`BYTES_MAX`)."""
    return bounded(default, ge=ge, le=BYTES_MAX, why="16 GiB in one buffer")


def batch_key(default: Any, ge: int = 1) -> Any:
    """Samples in one rank's batch (`BATCH_MAX`)."""
    return bounded(default, ge=ge, le=BATCH_MAX, why="a CPU rank's batch")


# A cell's time limit: past it the cell fails and the grid goes on. A week bounds what a
# run of huge `steps` or `repeats` can hold a host for (the ranks are stopped at it).
WEEK_S = 7 * 24 * 3600.0


def cell_timeout(default: float) -> Any:
    """The `timeout_s` field every experiment has, with its range."""
    return bounded(default, ge=0, le=WEEK_S, why="a week; split a longer grid")


def range_text(metadata: Mapping[str, Any]) -> str:
    """A field's declared range as `--help` and the refusals word it ('' if none), with
    where its upper bound comes from."""
    ge, le = metadata.get("ge"), metadata.get("le")
    if isinstance(ge, int) and isinstance(le, int) and 0 < le - ge <= SMALL_RANGE:
        return "one of " + ", ".join(map(str, range(ge, le + 1)))  # an enumeration
    parts = [f"≥ {ge:,}" if ge is not None else "", f"≤ {le:,}" if le is not None else ""]
    why = f" ({metadata['why']})" if metadata.get("why") and le is not None else ""
    return ", ".join(p for p in parts if p) + why


SMALL_RANGE = 7
"""An integer range this narrow is worded as its values (`range_text`): `one of 0, 1, 2, 3`."""


def check_range(key: str, value: Any, metadata: Mapping[str, Any]) -> None:
    """`value` (or each item of a list) within the field's declared range, if it has one."""
    ge, le = metadata.get("ge"), metadata.get("le")
    if ge is None and le is None:
        return
    for item in value if isinstance(value, list) else [value]:
        real = isinstance(item, int | float) and not isinstance(item, bool)
        if real and ((ge is not None and item < ge) or (le is not None and item > le)):
            raise ValueError(f"{key}={value!r}: must be {range_text(metadata)}")


def check_value(key: str, value: Any, hint: Any, whole: Any = None) -> None:
    """`value` of `key` against its type `hint` (see `check_types`); `whole`: the list it
    is an item of, which the refusal shows."""
    shown = f"{key}={value if whole is None else whole!r}"
    kinds = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    if typing.get_origin(hint) is list:
        if isinstance(value, list):
            for item in value:
                check_value(key, item, kinds[0], value)
        return
    if len(kinds) > 1 or not isinstance(kinds[0], type):
        return  # a union of several types, or Any: the schema's own check decides
    kind = kinds[0]
    if is_dataclass(kind) and isinstance(value, Mapping):
        check_types(kind, value, key + ".")
    elif kind is bool and not isinstance(value, bool):
        raise ValueError(f"{shown}: must be true or false")
    elif kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{shown}: must be an integer")
    elif kind is float and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise ValueError(f"{shown}: must be a number")
    elif kind is float and isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{shown}: must be a finite number")


def check_overrides(schema: type, overrides: Sequence[str]) -> None:
    """The command line's `key=value` overrides as typed, before Hydra converts them: a bool
    key given `2` or `yes` would be taken as true (see `check_value`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    for override in OverridesParser.create().parse_overrides(list(overrides)):
        if override.is_sweep_override() or override.is_delete():
            continue
        hint, node = None, schema
        for part in override.key_or_group.split("."):
            hint = typing.get_type_hints(node).get(part) if is_dataclass(node) else None
            if hint is None:
                break
            node = hint
        if hint is not None and not is_dataclass(hint):
            check_value(override.key_or_group, override.value(), hint)


def _typed(schema: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` checked against `schema`'s field types by OmegaConf, as plain values."""
    check_types(schema, values)
    from omegaconf import OmegaConf  # the parent's job: rank processes never parse
    from omegaconf.errors import OmegaConfBaseException

    try:
        typed = OmegaConf.merge(OmegaConf.structured(schema), dict(values))
        return OmegaConf.to_container(typed, resolve=True)
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", None) or "?"
        message = str(error).splitlines()[0]
        raise ValueError(f"{key}: {message}") from None


def parse_config(name: str, schema: type, values: Mapping[str, Any]) -> Any:
    """The schema object for `values`, refusing unknown keys, values of the wrong type and
    repeated values of a list key (a grid runs each cell once); the schema's own checks
    (`__post_init__`) run as it is built."""
    allowed = [f.name for f in fields(schema)]
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise ValueError(
            f"unknown key(s) {', '.join(unknown)} for experiment {name}; "
            f"allowed keys: {', '.join(allowed)}"
        )
    # Validate types through OmegaConf, then build the dataclass ourselves: its
    # __post_init__ checks run once, on plain Python values.
    plain = _typed(schema, values)
    for key, value in plain.items():
        if isinstance(value, list):
            check_unique(key, value)
    return schema(**plain)


def parse_run(values: Mapping[str, Any]) -> RunConfig:
    """The run-level keys as a `RunConfig` (each nested config checked as it is built)."""
    plain = _typed(RunConfig, {k: v for k, v in values.items() if v is not None})
    nested = {"wandb": WandbConfig, "cluster": ClusterConfig, "profile": ProfileConfig}
    return RunConfig(**{k: nested[k](**v) if k in nested else v for k, v in plain.items()})


def check_choices(key: str, values: Sequence[str], allowed: Sequence[str]) -> None:
    """A non-empty list of values, each one of `allowed`."""
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise ValueError(
            f"{key}={list(values)} has unknown value(s) {bad}; allowed values: {', '.join(allowed)}"
        )


def check_choice(key: str, value: Any, allowed: Sequence[str], why: str = "") -> None:
    """One value of a key that takes one of `allowed`."""
    if value not in allowed:
        raise ValueError(f"{key}={value!r} is unknown; allowed values: {', '.join(allowed)}{why}")


def check_positive(key: str, values: Sequence[int], minimum: int = 1) -> None:
    bad = [v for v in values if not isinstance(v, int) or isinstance(v, bool) or v < minimum]
    if bad or not values:
        raise ValueError(f"{key}={list(values)}: every value must be an integer ≥ {minimum}")


def check_number(key: str, value: Any, *, minimum: float = 0.0, inclusive: bool = False) -> None:
    """A finite real number above `minimum` (or at it, when `inclusive`)."""
    real = isinstance(value, int | float) and not isinstance(value, bool)
    if not (real and math.isfinite(value) and (value >= minimum if inclusive else value > minimum)):
        sign = "≥" if inclusive else ">"
        raise ValueError(f"{key}={value}: must be a finite number {sign} {minimum:g}")


def check_unique(key: str, values: Sequence[Any]) -> None:
    """Refuse a list that repeats a value: a grid would measure the same cell twice."""
    seen = [json.dumps(v, sort_keys=True, default=str) for v in values]
    repeated = sorted({s for s in seen if seen.count(s) > 1})
    if repeated:
        raise ValueError(
            f"{key}={list(values)} repeats {', '.join(repeated)}: each value must "
            "be unique (a grid measures each cell once)"
        )


def check_directory(key: str, path: str | Path, *, create: bool = True) -> None:
    """A directory a run can write into: an existing one it may write, or (`create`) one it
    can make under the nearest existing folder. A ValueError of one line names the key, the
    path and what is wrong (a file on the way, a symlink loop, a name too long, a FIFO, no
    write permission or a read-only file system); reads only, creates nothing."""
    shown = f"{key}={str(path)!r}"
    probe = Path(path).absolute()
    while True:
        try:
            mode = os.stat(probe).st_mode
            break
        except FileNotFoundError:
            if not create or probe.parent == probe:
                raise ValueError(f"{shown}: no such directory") from None
            probe = probe.parent
        except NotADirectoryError:
            raise ValueError(f"{shown}: a part of the path is a file, not a directory") from None
        except OSError as error:  # ELOOP, ENAMETOOLONG, EACCES, ...
            raise ValueError(f"{shown}: {error.strerror.lower()}") from None
    if not stat.S_ISDIR(mode):
        what = (
            "a file" if stat.S_ISREG(mode) else "not a regular directory (a FIFO, socket or device)"
        )
        where = "" if probe == Path(path).absolute() else f" ({probe} is on its path)"
        raise ValueError(f"{shown} is {what}, not a directory{where}; give a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        why = "read-only file system" if _read_only(probe) else "no write permission"
        raise ValueError(f"{shown}: cannot write into {probe} ({why})")


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def check_training(cfg: Any, counts: Sequence[str]) -> None:
    """Checks every training grid shares: each key of `counts` an integer ≥ 1, `warmup`
    and `seed` ≥ 0 and `lr` a finite number > 0 (where the config has them), `timeout_s`
    a finite number > 0."""
    for key in counts:
        check_positive(key, [getattr(cfg, key)])
    for key in ("warmup", "seed"):
        if hasattr(cfg, key):
            check_positive(key, [getattr(cfg, key)], minimum=0)
    if getattr(cfg, "lr", None) is not None:
        check_number("lr", cfg.lr)
    check_number("timeout_s", cfg.timeout_s)


def check_batch_split(batch_size: int, world_size: int) -> None:
    """A global batch every rank gets an equal shard of (`shard_batch`'s rule)."""
    if batch_size % world_size:
        raise ValueError(f"batch_size={batch_size} is not divisible by world_size={world_size}")


def check_gpt_model(model: Mapping[str, Any], **extra: Any) -> GPTConfig:
    """The `GPTConfig` a grid's `model` key describes, or a ValueError naming the key."""
    from impls.models import GPTConfig

    try:
        check_types(GPTConfig, model, "model.")
        return GPTConfig(**model, **extra)
    except (TypeError, ValueError) as error:
        raise ValueError(f"model={dict(model)}: {error}") from error


def gpt_rank_bytes(model: GPTConfig, sequences: int, copies: int = 2) -> int:
    """An upper bound on what one rank training `model` on `sequences` sequences holds:
    fp32 weights, gradients and Adam's two moments (16 bytes a parameter) for `copies`
    replicas (the model and its twin or reference), and the activations of the batch."""
    from impls.costmodel.activations import activation_bytes

    h, f, v = model.d_model, model.ff_dim, model.vocab_size
    params = model.n_layers * (4 * h * h + 2 * h * f) + v * h * (1 if model.tie_embeddings else 2)
    params += model.seq_len * h
    return copies * 16 * params + activation_bytes(model, sequences)


def host_memory_bytes() -> int:
    """Memory available to new processes now: MemAvailable, capped by a cgroup v2 limit
    (elsewhere than Linux: the free pages, or all of them)."""
    available, page = 0, os.sysconf("SC_PAGE_SIZE")
    for pages in ("SC_PHYS_PAGES", "SC_AVPHYS_PAGES"):
        with contextlib.suppress(OSError, ValueError):
            available = page * os.sysconf(pages)
    with contextlib.suppress(OSError, ValueError, StopIteration), open("/proc/meminfo") as meminfo:
        line = next(line for line in meminfo if line.startswith("MemAvailable:"))
        available = int(line.split()[1]) * 1024
    cgroup = Path("/sys/fs/cgroup")
    with contextlib.suppress(OSError, ValueError):
        cap = (cgroup / "memory.max").read_text().strip()
        if cap != "max":
            used = int((cgroup / "memory.current").read_text())
            available = min(available, int(cap) - used)
    return max(available, 0)


def host_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def rank_limit(cores: int, memory_bytes: int) -> int:
    """The most ranks one host spawns for a cell: a few per core (at least 8), and no more
    than its memory holds at 0.4 GB per rank."""
    by_cores = max(MIN_RANK_LIMIT, RANKS_PER_CORE * cores)
    return max(1, min(by_cores, memory_bytes // RANK_OVERHEAD_BYTES))


def check_host(cfg: Any, cluster: ClusterConfig) -> None:
    """Refuse, before any rank starts, a grid `cluster=local` cannot hold on this host: a
    cell with more ranks than `cluster.max_ranks` (or the host's limit), or one whose ranks'
    buffers (the schema's `rank_bytes` estimate) exceed the memory available.

    A schema takes part by naming the key its world sizes come from (`RANK_KEY`) and, where
    some keys size its buffers, those keys (`SIZE_KEYS`) and `rank_bytes()`, an upper
    bound on what one rank of the grid's largest cell allocates."""
    key = getattr(type(cfg), "RANK_KEY", None)
    if key is None:
        return
    sizes = getattr(cfg, key)
    world = max(sizes) if isinstance(sizes, list) else sizes
    memory = host_memory_bytes() if cluster.memory_gb is None else int(cluster.memory_gb * 1e9)
    limit = cluster.max_ranks
    how = "cluster.max_ranks"
    if limit is None:
        limit = rank_limit(host_cores(), memory)
        given = " (cluster.memory_gb)" if cluster.memory_gb is not None else ""
        how = f"this host's limit ({host_cores()} cores, {memory / 1e9:.1f} GB available{given})"
    if world > limit:
        raise ValueError(
            f"{key}={sizes}: a cell of {world} ranks is more than cluster=local "
            f"spawns here: at most {limit}, {how}; lower {key}, or set "
            "cluster.max_ranks to allow more"
        )
    if not hasattr(cfg, "rank_bytes"):
        return
    need = world * (cfg.rank_bytes() + RANK_OVERHEAD_BYTES)
    if need > memory:
        keys = type(cfg).SIZE_KEYS
        shown = ", ".join(f"{k}={getattr(cfg, k)}" for k in keys)
        raise ValueError(
            f"{shown}: the largest cell's {world} ranks would allocate about "
            f"{need / 1e9:.3g} GB, more than the {memory / 1e9:.3g} GB available "
            f"(cluster.memory_gb); lower {' or '.join(keys)}"
        )
