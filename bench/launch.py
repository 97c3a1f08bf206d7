"""A persistent pool of N torch.distributed ranks with hard timeouts.

Starting a rank costs seconds here (a fresh interpreter imports torch, then joins the
process group), so a grid of many cells reuses one pool: the ranks stay alive between
`RankPool.run` calls and each call ships them a function to run in their default process
group. A cell whose ranks raise, crash or hang is killed as a whole and reported as a
`RankFailure` naming each rank's failure; the next `run` starts a fresh pool, so one
failing cell does not poison the next.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import pickle
import shutil
import signal
import socket
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterable
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

__all__ = ["RUN_DIR_ENV", "RankFailure", "RankPool", "run_on_ranks"]

# Ranks find the pool's private run directory in this environment variable.
RUN_DIR_ENV = "DISTBENCH_RUN_DIR"

# After the first rank fails, its peers are usually blocked in a send/recv waiting for it;
# give them this long to report their own errors, then kill the pool.
FAILURE_GRACE_S = 1.0
# SIGTERM first, SIGKILL for whatever is still alive after this long.
TERMINATE_GRACE_S = 2.0
# How often a rank checks that its parent is still alive.
WATCHDOG_PERIOD_S = 0.5
# A rank's watchdog takes its SIGTERM (a subprocess of a rank inherits it blocked).
TAKES_SIGTERM = hasattr(signal, "sigtimedwait")


class RankFailure(RuntimeError):
    """A run on the pool failed.

    `errors` maps rank -> traceback text, ``"exited with code X"`` or
    ``"timed out after T s"``. `killed` lists the ranks that had not failed themselves but
    were still running (typically blocked on a failed peer) when the pool was killed.
    """

    def __init__(self, errors: dict[int, str], killed: Iterable[int] = ()) -> None:
        self.errors = dict(sorted(errors.items()))
        self.killed = sorted(killed)
        super().__init__(self._describe())

    def __reduce__(self) -> tuple[Any, ...]:
        # The default reduce would call __init__ with the message only.
        return (type(self), (self.errors, self.killed))

    def _describe(self) -> str:
        def last_line(text: str) -> str:
            lines = [line for line in text.strip().splitlines() if line.strip()]
            return lines[-1].strip() if lines else "(no message)"

        summary = "; ".join(f"rank {r}: {last_line(e)}" for r, e in self.errors.items())
        parts = [f"{len(self.errors)} rank(s) failed: {summary}"]
        if self.killed:
            parts.append(f"rank(s) {self.killed} were still running and were killed")
        for rank, error in self.errors.items():
            if "\n" in error.strip():  # a traceback: show it whole, indented
                body = "\n".join("    " + line for line in error.rstrip().splitlines())
                parts.append(f"--- rank {rank} ---\n{body}")
        return "\n".join(parts)


def _loopback_interface() -> str:
    """This host's loopback interface: the one Linux flags IFF_LOOPBACK, else "lo…" (macOS)."""
    names = [name for _, name in socket.if_nameindex()]
    for name in names:
        flags = Path(f"/sys/class/net/{name}/flags")
        if int(flags.read_text(), 16) & 0x8 if flags.exists() else name.startswith("lo"):
            return name
    raise RuntimeError(f"no loopback interface to pin gloo to among {names}")


def _default_threads(world_size: int) -> int:
    # The affinity mask, not os.cpu_count(): containers often see more CPUs than they get.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // world_size)


def _sigterm_within(seconds: float) -> bool:
    """Whether a SIGTERM came within `seconds` (taken here where the OS can wait for one)."""
    if TAKES_SIGTERM:
        return signal.sigtimedwait([signal.SIGTERM], seconds) is not None
    time.sleep(seconds)  # no sigtimedwait (macOS): a SIGTERM ends the rank outright
    return False


def _watch_parent(parent_pid: int, run_dir: str) -> None:
    """Exit this rank once its parent is gone or on SIGTERM, removing the run directory
    first: a parent that died abruptly (SIGKILL, `os._exit`, a SIGTERM to its whole process
    group from `timeout`, `scancel` or a terminal) could not. SIGTERM is blocked in the
    rank's other threads, so it lands here even while the main thread waits inside gloo."""
    while True:
        terminated = _sigterm_within(WATCHDOG_PERIOD_S)
        if terminated or os.getppid() != parent_pid:
            shutil.rmtree(run_dir, ignore_errors=True)
            if terminated:  # then die of it, as its default action would have
                signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
                signal.raise_signal(signal.SIGTERM)
            os._exit(1)


def _send(conn: Connection, message: tuple[int, bool, Any]) -> None:
    """Send a result; one that cannot be pickled becomes that rank's error."""
    rank, ok, value = message
    try:
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        error = f"result of rank {rank} could not be pickled:\n{traceback.format_exc()}"
        payload = pickle.dumps((rank, False, error), protocol=pickle.HIGHEST_PROTOCOL)
    conn.send_bytes(payload)


def _rank_main(
    rank: int,
    world_size: int,
    backend: str,
    init_method: str,
    timeout_s: float,
    env: dict[str, str],
    parent_pid: int,
    conn: Connection,
) -> None:
    """Entry point of one rank process: join the group, then serve tasks until told to stop."""
    # Set before torch is imported: its OpenMP pool and gloo's interface are read once.
    os.environ.update(env)
    threads = int(env["OMP_NUM_THREADS"])
    if TAKES_SIGTERM:  # before any thread starts: each inherits the mask, the watchdog waits
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
    watchdog_args = (parent_pid, env[RUN_DIR_ENV])
    threading.Thread(target=_watch_parent, args=watchdog_args, daemon=True).start()
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(threads)
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
    except BaseException:
        _send(conn, (rank, False, traceback.format_exc()))
        return
    _send(conn, (rank, True, None))
    while True:
        try:
            payload = conn.recv_bytes()
        except (EOFError, OSError):  # the parent closed its end: nothing more to do
            os._exit(0)
        try:
            task = pickle.loads(payload)
            if task is None:
                break
            fn, args, kwargs = task
            _send(conn, (rank, True, fn(*args, **kwargs)))
        except BaseException:  # SystemExit from fn is a failure of this run, too
            _send(conn, (rank, False, traceback.format_exc()))
    dist.destroy_process_group()


_LIVE_POOLS: weakref.WeakSet[RankPool] = weakref.WeakSet()


@atexit.register
def _close_live_pools() -> None:
    for pool in list(_LIVE_POOLS):
        pool.close()


class RankPool:
    """`world_size` rank processes in one process group, reused across `run` calls.

    Ranks start lazily on the first `run`. Not thread-safe: one `run` at a time.

    Protocol (one duplex pipe per rank): the rank sends ``(rank, True, None)`` once its
    process group is up, then for every task it receives (a pickled ``(fn, args, kwargs)``,
    or ``None`` to stop) it sends back ``(rank, ok, value_or_traceback)``.

    Nothing listens beyond loopback: ranks meet through a file store in a private run
    directory (0700, one per start; torch's TCP store would listen on every interface) and
    gloo is pinned to loopback. Ranks find the directory in `DISTBENCH_RUN_DIR` for their
    scratch files; it goes when the pool closes, or when a rank sees SIGTERM or its parent gone.
    """

    def __init__(
        self,
        world_size: int,
        *,
        backend: str = "gloo",
        timeout_s: float = 120.0,
        threads_per_rank: int | None = None,
        start_timeout_s: float = 120.0,
    ) -> None:
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
        if timeout_s <= 0 or start_timeout_s <= 0:
            raise ValueError(
                f"timeout_s and start_timeout_s must be > 0, got {timeout_s}, {start_timeout_s}"
            )
        if threads_per_rank is not None and threads_per_rank < 1:
            raise ValueError(f"threads_per_rank must be >= 1, got {threads_per_rank}")
        self.world_size = world_size
        self.backend = backend
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.threads_per_rank = threads_per_rank or _default_threads(world_size)
        self._procs: list[multiprocessing.process.BaseProcess] = []
        self._conns: list[Connection] = []
        self._run_dir: str | None = None
        _LIVE_POOLS.add(self)

    @property
    def processes(self) -> list[multiprocessing.process.BaseProcess]:
        """The current rank processes (empty before the first run and after close)."""
        return list(self._procs)

    @property
    def run_dir(self) -> str | None:
        """The current private run directory (None before the first run and after close)."""
        return self._run_dir

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def run(
        self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None, **kwargs: Any
    ) -> list:
        """Run ``fn(*args, **kwargs)`` on every rank at once; return the values in rank order.

        `fn` must be picklable by reference (a module-level function). Raises `RankFailure`
        if any rank raises, exits, or the run takes longer than `timeout_s` (default: the
        pool's); every rank is then killed and the next call starts a fresh pool.
        """
        # Pickle once, up front: a bad task fails here, before any rank has started it.
        payload = pickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        if self._procs and not all(proc.is_alive() for proc in self._procs):
            self.close()  # a rank died while idle: start over rather than hang on it
        if not self._procs:
            self._start()
        limit = self.timeout_s if timeout_s is None else timeout_s
        unreachable: dict[int, str] = {}
        for rank, conn in enumerate(self._conns):
            try:
                conn.send_bytes(payload)
            except OSError as err:  # the rank died between the liveness check and now
                unreachable[rank] = f"could not receive the task: {err!r}"
        if unreachable:
            self.close()
            raise RankFailure(unreachable, killed=set(range(self.world_size)) - set(unreachable))
        return self._collect(time.monotonic() + limit, limit)

    def close(self) -> None:
        """Terminate, then kill, every rank process; remove the run directory. Idempotent."""
        procs, conns, run_dir = self._procs, self._conns, self._run_dir
        self._procs, self._conns, self._run_dir = [], [], None
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + TERMINATE_GRACE_S
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in conns:
            conn.close()
        if run_dir is not None:  # only now: no rank is left to write into it
            shutil.rmtree(run_dir, ignore_errors=True)

    def _start(self) -> None:
        """Spawn the ranks and wait until each has joined the process group."""
        try:
            self._spawn()
        except BaseException:
            self.close()  # never keep half a pool around
            raise
        self._collect(time.monotonic() + self.start_timeout_s, self.start_timeout_s)

    def _spawn(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        # mkdtemp: a fresh directory of mode 0700, so the store and the ranks' files are
        # this user's alone and a store file never outlives its pool.
        self._run_dir = tempfile.mkdtemp(prefix="distbench-run-")
        init_method = f"file://{os.path.join(self._run_dir, 'store')}"
        loopback = _loopback_interface()  # for gloo, and NCCL's bootstrap with backend=nccl
        env = {
            "OMP_NUM_THREADS": str(self.threads_per_rank),
            RUN_DIR_ENV: self._run_dir,
            "GLOO_SOCKET_IFNAME": loopback,
            "NCCL_SOCKET_IFNAME": loopback,
        }
        group = (self.world_size, self.backend, init_method, self.timeout_s, env, os.getpid())
        for rank in range(self.world_size):
            parent_end, child_end = ctx.Pipe(duplex=True)
            proc = ctx.Process(
                target=_rank_main,
                args=(rank, *group, child_end),
                name=f"distbench-rank{rank}",
                daemon=True,  # multiprocessing also terminates daemons when the parent exits
            )
            proc.start()
            child_end.close()  # so the rank's end alone keeps the pipe open
            self._procs.append(proc)
            self._conns.append(parent_end)

    def _collect(self, deadline: float, limit: float) -> list:
        """Gather one message per rank, or kill the pool and raise `RankFailure`."""
        values: dict[int, Any] = {}
        errors: dict[int, str] = {}
        pending = set(range(self.world_size))
        by_handle: dict[Any, int] = {}
        for rank in pending:
            by_handle[self._conns[rank]] = rank
            by_handle[self._procs[rank].sentinel] = rank
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for handle in wait(list(by_handle), timeout=remaining):
                rank = by_handle.get(handle)
                if rank is None or rank not in pending:
                    continue  # its other handle already settled it in this round
                if isinstance(handle, Connection):
                    message = self._receive(rank)
                else:  # the process exited; drain a message it may have sent first
                    message = self._receive(rank) if self._conns[rank].poll() else None
                    message = message or (rank, False, self._exit_text(rank))
                _, ok, value = message
                pending.discard(rank)
                # A finished rank's handles would keep `wait` returning at once: drop them.
                del by_handle[self._conns[rank]], by_handle[self._procs[rank].sentinel]
                if ok:
                    values[rank] = value
                else:
                    errors[rank] = value
                    # The peers are likely blocked on this rank: wait briefly, not fully.
                    deadline = min(deadline, time.monotonic() + FAILURE_GRACE_S)
        if not errors and not pending:
            return [values[rank] for rank in range(self.world_size)]
        # Ranks still pending after another rank failed were waiting on it, not timed out.
        killed = sorted(pending) if errors else []
        if not errors:
            errors = {rank: f"timed out after {limit:g} s" for rank in pending}
        self.close()
        raise RankFailure(errors, killed)

    def _receive(self, rank: int) -> tuple[int, bool, Any]:
        try:
            return pickle.loads(self._conns[rank].recv_bytes())
        except (EOFError, OSError):  # the pipe closed: the rank is gone
            return (rank, False, self._exit_text(rank))
        except Exception:
            return (rank, False, f"result could not be unpickled:\n{traceback.format_exc()}")

    def _exit_text(self, rank: int) -> str:
        proc = self._procs[rank]
        proc.join(1.0)  # the exit code is set only once the process is reaped
        code = proc.exitcode
        if code is not None and code < 0:
            return f"exited with code {code} (killed by signal {-code})"
        return f"exited with code {code}"


def run_on_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout_s: float = 120.0,
    **kwargs: Any,
) -> list:
    """Run ``fn(*args, **kwargs)`` once on a fresh pool of `world_size` gloo ranks."""
    with RankPool(world_size, timeout_s=timeout_s) as pool:
        return pool.run(fn, *args, **kwargs)
