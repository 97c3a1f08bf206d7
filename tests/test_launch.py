"""RankPool: N gloo ranks that run a function together, with hard timeouts.

A failure here means multi-process tests and experiment grids cannot be trusted to
finish: a raising, crashing or hanging rank would hang the caller, be misreported,
poison the next cell, or leave rank processes behind; or that a run leaves files behind
(the pool's run directory, the host lock's file) when a rank or its parent is killed.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from bench.launch import RUN_DIR_ENV, RankFailure, RankPool, run_on_ranks

REPO_ROOT = Path(__file__).resolve().parents[1]


# --- functions run on the ranks (module-level so the ranks can import them) ---------------


def rank_info(tag: str, *, scale: int = 1) -> tuple[int, int, str, int]:
    import torch.distributed as dist

    return dist.get_rank(), dist.get_world_size(), tag, scale * dist.get_rank()


def exchange_with_peer() -> list[float]:
    """Each of two ranks sends its rank to the other over the pool's default group."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    outgoing, incoming = torch.tensor([float(rank)]), torch.zeros(1)
    peer = 1 - rank
    if rank == 0:
        dist.send(outgoing, peer)
        dist.recv(incoming, peer)
    else:
        dist.recv(incoming, peer)
        dist.send(outgoing, peer)
    return incoming.tolist()


def raise_on_rank_one() -> int:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("rank one refuses")
    return 0


def raise_while_peer_waits() -> None:
    """Rank 1 raises; rank 0 blocks in a recv that will never be matched."""
    import torch
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("gave up before sending")
    dist.recv(torch.zeros(1), 1)


def recv_from_silent_peer() -> None:
    import torch
    import torch.distributed as dist

    if dist.get_rank() == 0:
        dist.recv(torch.zeros(1), 1)
    else:
        time.sleep(3600)


def exit_on_rank_one() -> None:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        os._exit(3)


def run_dir_seen_by_rank() -> tuple[str | None, bool]:
    return os.environ.get(RUN_DIR_ENV), os.path.isdir(os.environ.get(RUN_DIR_ENV, ""))


def lock_file_of_the_host() -> tuple[str, bool]:
    """Where `HostComputeLock` made its file, and whether its name outlived entering it."""
    from bench.kit.host import HostComputeLock

    with HostComputeLock() as lock, lock():
        return lock.path, os.path.exists(lock.path)


def lock_file_without_a_run_dir() -> tuple[str, bool]:
    """As under torchrun: no `DISTBENCH_RUN_DIR`, so the system's temp dir holds the file."""
    saved = os.environ.pop(RUN_DIR_ENV)
    try:
        return lock_file_of_the_host()
    finally:
        os.environ[RUN_DIR_ENV] = saved


def die_holding_the_lock() -> None:
    """Rank 1 is killed (SIGKILL: no cleanup of its own) while it holds the host's lock."""
    import torch.distributed as dist

    from bench.kit.host import HostComputeLock

    with HostComputeLock() as lock:
        if dist.get_rank() == 1:
            with lock():
                dist.barrier()
                os.kill(os.getpid(), signal.SIGKILL)
        dist.barrier()
        with lock():  # rank 0 queues; the kernel frees the lock when its holder dies
            time.sleep(3600)


# --- helpers ------------------------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    """True if `pid` runs; a zombie (exited, not yet reaped by init) counts as dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def wait_until_dead(pids: list[int], within_s: float) -> list[int]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if pid_alive(pid)]
        if not alive:
            return []
        time.sleep(0.1)
    return [pid for pid in pids if pid_alive(pid)]


@pytest.fixture(scope="module")
def pool():
    with RankPool(2, timeout_s=60.0) as shared:
        yield shared


# --- tests --------------------------------------------------------------------------------


def test_results_come_back_in_rank_order(pool: RankPool) -> None:
    assert pool.run(rank_info, "hello", scale=10) == [(0, 2, "hello", 0), (1, 2, "hello", 10)]
    assert pool.run(exchange_with_peer) == [[1.0], [0.0]]


def test_ranks_are_reused_between_runs(pool: RankPool) -> None:
    pool.run(rank_info, "warm")
    pids = [proc.pid for proc in pool.processes]
    pool.run(rank_info, "again")
    assert [proc.pid for proc in pool.processes] == pids


def test_raising_rank_is_named_and_next_run_gets_a_fresh_pool(pool: RankPool) -> None:
    pool.run(rank_info, "warm")
    old_pids = [proc.pid for proc in pool.processes]
    with pytest.raises(RankFailure) as caught:
        pool.run(raise_on_rank_one)
    assert list(caught.value.errors) == [1]
    assert "ValueError: rank one refuses" in caught.value.errors[1]
    assert "rank 1: ValueError: rank one refuses" in str(caught.value)
    assert wait_until_dead(old_pids, within_s=5.0) == []
    assert pool.run(rank_info, "fresh") == [(0, 2, "fresh", 0), (1, 2, "fresh", 1)]
    assert {proc.pid for proc in pool.processes}.isdisjoint(old_pids)


def test_peer_blocked_on_a_raising_rank_is_killed_quickly(pool: RankPool) -> None:
    started = time.monotonic()
    with pytest.raises(RankFailure) as caught:
        pool.run(raise_while_peer_waits, timeout_s=30.0)
    # The grace after the first error is about a second, not the 30 s run timeout.
    assert time.monotonic() - started < 10.0
    assert list(caught.value.errors) == [1]
    assert caught.value.killed == [0]
    assert "still running and were killed" in str(caught.value)


def test_hanging_ranks_time_out(pool: RankPool) -> None:
    pool.run(rank_info, "warm")  # start outside the timed window
    started = time.monotonic()
    with pytest.raises(RankFailure) as caught:
        pool.run(recv_from_silent_peer, timeout_s=2.0)
    assert time.monotonic() - started < 2.0 + 5.0
    assert caught.value.errors == {0: "timed out after 2 s", 1: "timed out after 2 s"}


def test_exiting_rank_reports_its_exit_code(pool: RankPool) -> None:
    with pytest.raises(RankFailure) as caught:
        pool.run(exit_on_rank_one, timeout_s=30.0)
    assert caught.value.errors == {1: "exited with code 3"}
    assert "rank 1: exited with code 3" in str(caught.value)


def test_close_leaves_no_rank_alive() -> None:
    with RankPool(1) as single:
        assert single.run(rank_info, "solo") == [(0, 1, "solo", 0)]
        procs = single.processes
        single.close()
        single.close()  # idempotent
    assert procs and not any(proc.is_alive() for proc in procs)
    assert wait_until_dead([proc.pid for proc in procs], within_s=1.0) == []


def test_run_on_ranks_is_one_shot() -> None:
    assert run_on_ranks(rank_info, 1, "once", scale=3, timeout_s=60.0) == [(0, 1, "once", 0)]


def test_ranks_die_when_the_parent_dies_abruptly() -> None:
    # The parent exits with os._exit mid-run, skipping atexit and multiprocessing's own
    # cleanup, while the rank is busy: only the rank's parent watchdog can end it.
    script = textwrap.dedent(
        """
        import os, threading, time
        from bench.launch import RankPool
        pool = RankPool(1, timeout_s=60.0)
        print(pool.run(os.getpid)[0], pool.run_dir, flush=True)
        threading.Timer(0.5, os._exit, (0,)).start()
        pool.run(time.sleep, 60)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    rank_pid, run_dir = done.stdout.split()
    assert wait_until_dead([int(rank_pid)], within_s=5.0) == []
    assert not os.path.exists(run_dir)  # the rank removed it: its parent could not


@pytest.mark.parametrize("world_size", [0, -1])
def test_world_size_below_one_is_refused(world_size: int) -> None:
    with pytest.raises(ValueError, match="world_size"):
        RankPool(world_size)


def test_pool_owns_a_private_run_dir_and_removes_it() -> None:
    with RankPool(2, timeout_s=60.0) as pool:
        assert pool.run_dir is None  # made with the ranks, not before
        seen = pool.run(run_dir_seen_by_rank)
        run_dir = pool.run_dir
        assert run_dir is not None and seen == [(run_dir, True)] * 2
        assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
        with pytest.raises(RankFailure):
            pool.run(exit_on_rank_one, timeout_s=30.0)
        assert pool.run_dir is None and not os.path.exists(run_dir)  # gone with the failure
        pool.run(rank_info, "fresh")
        fresh = pool.run_dir
        assert fresh is not None and fresh != run_dir and os.path.isdir(fresh)
    assert pool.run_dir is None and not os.path.exists(fresh)


def test_host_lock_lives_in_the_run_dir_and_its_name_goes_at_once(pool: RankPool) -> None:
    values = pool.run(lock_file_of_the_host)
    paths = {path for path, _ in values}
    assert len(paths) == 1 and os.path.dirname(paths.pop()) == pool.run_dir
    assert [exists for _, exists in values] == [False, False]


def test_host_lock_without_a_run_dir_removes_its_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the ranks' system temp dir
    with RankPool(2, timeout_s=60.0) as pool:
        values = pool.run(lock_file_without_a_run_dir)
    assert {os.path.dirname(path) for path, _ in values} == {str(tmp_path)}
    assert [exists for _, exists in values] == [False, False]
    assert list(tmp_path.iterdir()) == []


def test_rank_killed_holding_the_host_lock_leaves_no_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the lock file went before run dirs
    with RankPool(2, timeout_s=60.0) as pool:
        pool.run(rank_info, "warm")
        run_dir = pool.run_dir
        with pytest.raises(RankFailure) as caught:
            pool.run(die_holding_the_lock, timeout_s=30.0)
        assert caught.value.errors == {1: "exited with code -9 (killed by signal 9)"}
        assert caught.value.killed == [0]
        assert run_dir is not None and not os.path.exists(run_dir)
    assert list(tmp_path.iterdir()) == []


def test_sigterm_ends_a_rank_blocked_in_gloo_and_its_run_dir(pool: RankPool) -> None:
    """SIGTERM still kills a rank at once, waiting in gloo or not, and its run dir goes."""
    pool.run(rank_info, "warm")
    run_dir, rank_zero = pool.run_dir, pool.processes[0].pid
    threading.Timer(1.0, os.kill, (rank_zero, signal.SIGTERM)).start()
    started = time.monotonic()
    with pytest.raises(RankFailure) as caught:
        pool.run(recv_from_silent_peer, timeout_s=30.0)
    assert time.monotonic() - started < 10.0
    assert caught.value.errors == {0: "exited with code -15 (killed by signal 15)"}
    assert caught.value.killed == [1]
    assert run_dir is not None and not os.path.exists(run_dir)


def test_sigterm_to_the_whole_process_group_leaves_nothing() -> None:
    # As `timeout`, `scancel` or a terminal do: the parent dies without running atexit,
    # and so do its ranks, unless they clean up first.
    script = textwrap.dedent(
        """
        import os, time
        from bench.launch import RankPool
        pool = RankPool(2, timeout_s=60.0)
        print(*pool.run(os.getpid), pool.run_dir, flush=True)
        pool.run(time.sleep, 60)
        """
    )
    grid = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        text=True,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    *rank_pids, run_dir = grid.stdout.readline().split()
    time.sleep(1.0)  # both ranks are inside time.sleep
    os.killpg(grid.pid, signal.SIGTERM)
    assert grid.wait(timeout=30) == -signal.SIGTERM
    grid.stdout.close()
    assert wait_until_dead([int(pid) for pid in rank_pids], within_s=5.0) == []
    assert os.path.isabs(run_dir) and not os.path.exists(run_dir)
