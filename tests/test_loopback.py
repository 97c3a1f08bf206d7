"""`cluster=local` listens on loopback only: no socket of a rank or of the parent is reachable
from another interface, at any time of a run.

A failure here means that anyone who can reach this host over the network can talk to a
running grid's ranks (torch's TCP store takes writes from anyone, unauthenticated) — the
audit of issue 13 connected to one from another interface mid-run.

Listening sockets are read from /proc/net/tcp and /proc/net/tcp6 (state 0A) and tied to
their process through the socket inodes in /proc/<pid>/fd; no network access is needed.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

import pytest

from bench.launch import RankPool, _loopback_interface

REPO_ROOT = Path(__file__).resolve().parents[1]
LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")


class Listener(NamedTuple):
    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int
    pid: int

    @property
    def on_loopback(self) -> bool:
        mapped = getattr(self.address, "ipv4_mapped", None)  # ::ffff:127.0.0.1
        return (mapped or self.address).is_loopback


def _decode(hex_address: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    """'0100007F:1F90' -> (127.0.0.1, 8080): the kernel prints each 32-bit word host-endian."""
    address, port = hex_address.split(":")
    raw = bytes.fromhex(address)
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(raw), int(port, 16)


def _socket_inodes(pids: set[int]) -> dict[str, int]:
    """{socket inode: pid} over the open file descriptors of `pids` (gone ones skipped)."""
    inodes: dict[str, int] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes[target[len("socket:[") : -1]] = pid
    return inodes


def listeners(pids: set[int]) -> set[Listener]:
    """Every TCP socket of `pids` that is listening, with the address it is bound to."""
    inodes = _socket_inodes(pids)
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN and fields[9] in inodes:
                found.add(Listener(*_decode(fields[1]), inodes[fields[9]]))
    return found


def process_tree(root: int) -> set[int]:
    """`root` and all its live descendants."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, grew = {root}, True
    while grew:
        children = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= children
        grew = bool(children)
    return tree


class Sampler:
    """Samples the listeners of a process tree from a thread, every `period_s`."""

    def __init__(self, root: int, period_s: float = 0.05) -> None:
        self.root, self.period_s = root, period_s
        self.seen: set[Listener] = set()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.seen |= listeners(process_tree(self.root))
            self.samples += 1
            self._stop.wait(self.period_s)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# --- functions run on the ranks -----------------------------------------------------------


def collectives_in_a_subgroup() -> dict[str, str | int | None]:
    """A new group (gloo connects a fresh set of pairs) and an all-reduce in each group."""
    import torch
    import torch.distributed as dist

    group = dist.new_group([0, 1])
    total = torch.ones(1)
    dist.all_reduce(total, group=group)
    dist.all_reduce(total)
    time.sleep(0.5)  # let the sampler see the ranks with both groups up
    dist.destroy_process_group(group)
    return {
        "pid": os.getpid(),
        "total": int(total.item()),
        "gloo_interface": os.environ.get("GLOO_SOCKET_IFNAME"),
    }


# --- tests --------------------------------------------------------------------------------


def test_the_scan_sees_a_socket_listening_on_every_interface() -> None:
    """The check below could not fail if the scan missed sockets bound to the wildcard."""
    for family, wildcard in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        if family == socket.AF_INET6 and not socket.has_ipv6:
            continue
        with socket.socket(family, socket.SOCK_STREAM) as exposed:
            exposed.bind((wildcard, 0))
            exposed.listen()
            port = exposed.getsockname()[1]
            mine = {ln for ln in listeners({os.getpid()}) if ln.port == port}
            assert [str(ln.address) for ln in mine] == [wildcard]
            assert not any(ln.on_loopback for ln in mine)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as private:
        private.bind(("127.0.0.1", 0))
        private.listen()
        port = private.getsockname()[1]
        assert [ln.on_loopback for ln in listeners({os.getpid()}) if ln.port == port] == [True]


def test_loopback_interface_is_the_loopback_one() -> None:
    name = _loopback_interface()
    flags = Path(f"/sys/class/net/{name}/flags")
    assert int(flags.read_text(), 16) & 0x8 if flags.exists() else name.startswith("lo")


def test_rank_pool_listens_on_loopback_only() -> None:
    before = listeners(process_tree(os.getpid()))  # not the pool's: other tests may hold some
    with RankPool(2, timeout_s=60.0) as pool, Sampler(os.getpid()) as sampler:
        values = pool.run(collectives_in_a_subgroup)
        between_runs = listeners(process_tree(os.getpid()))
        pool.run(collectives_in_a_subgroup)
    rank_pids = {value["pid"] for value in values}
    assert [value["total"] for value in values] == [4, 4]
    assert {value["gloo_interface"] for value in values} == {_loopback_interface()}
    assert sampler.samples > 1
    # gloo's pairs listen: the scan must find them, or it proves nothing.
    assert {ln.pid for ln in sampler.seen} >= rank_pids
    assert {ln.pid for ln in between_runs} >= rank_pids
    opened = (sampler.seen | between_runs) - before
    assert sorted(str(ln) for ln in opened if not ln.on_loopback) == []


def test_local_grid_listens_on_loopback_only(tmp_path: Path) -> None:
    """A real grid through the entry point: the parent, its ranks and any helper process."""
    command = [
        sys.executable,
        "-m",
        "bench",
        "experiment=collectives",
        "profile=ci",
        "world_sizes=[2]",
        "message_bytes=[4096]",
        "collectives=[broadcast]",
        "repeats=1",
        f"report_dir={tmp_path / 'report'}",
        "wandb.mode=offline",
    ]
    grid = subprocess.Popen(
        command,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    with Sampler(grid.pid) as sampler:
        output, _ = grid.communicate(timeout=300)
    assert grid.returncode == 0, output[-3000:]
    assert (tmp_path / "report" / "results.csv").exists()
    assert sampler.samples > 1
    assert len({ln.pid for ln in sampler.seen}) >= 2, "the scan saw no rank listening"
    exposed = sorted(str(ln) for ln in sampler.seen if not ln.on_loopback)
    assert exposed == []
