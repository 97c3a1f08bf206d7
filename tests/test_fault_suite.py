"""The fault-injection suite: each fault a user or a cluster can throw at a run, and what the
harness must do about it (issue 13).

| fault                                         | expected outcome                                    |
|-----------------------------------------------|-----------------------------------------------------|
| kill -9 of a rank mid-cell                    | that cell failed, the grid goes on, exit 1          |
| SIGSTOP of a rank mid-cell                    | that cell failed at its timeout, the grid goes on   |
| a cell off its reference (`wrong > 0`)        | status "wrong" (never "ok"), exit 1                 |
| every cell failing                            | report still written, exit 1, summary says so       |
| SIGINT / SIGTERM of the parent mid-grid       | finished rows kept, exit 130 / 143, one line saying |
|                                               | how to resume, no traceback                         |
| a second run into a report_dir in use         | refused in one line (exit 2); the first run intact  |
| corrupted results.csv (each kind below)       | refused before any cell, file and line named,       |
|                                               | the file byte for byte unchanged                    |
| an empty grid                                 | refused before work, in one line                    |
| results.csv's last line cut at any byte       | refused before any cell, file and line named        |
| report_dir a file / another experiment's      | refused before any cell, in one line                |
| report_dir under a file, in a symlink loop,   | refused before any cell, in one line naming the     |
| too long, under /proc; a report file a        | path and the problem; nothing created               |
| directory or a FIFO                           |                                                     |
| the disk full or read-only mid-run            | one line naming the file, exit 1, no traceback      |
| results.csv a planted link                    | refused before any cell                             |
| report.md / headline.json planted links       | replaced, the link's target untouched               |
| `resume=true` with changed settings           | the cell is measured again                          |

Under every fault: no rank process outlives the run, and nothing is left behind in the report
directory or in the temporary directory (the pool's private run directory included).
That the rendezvous listens on loopback only is `tests/test_loopback.py`.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.config import WandbConfig
from bench.results import ResultStore
from bench.runner import run_experiment
from tests.runner_cells import (
    LOCAL,
    FakeConfig,
    fake_experiment,
    is_running,
    rank_pids,
    wait_until,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 4.0
# What a finished run leaves in its report directory, and nothing else.
REPORT_FILES = {"results.csv", "report.md", "headline.json"}


def start(
    tmp: Path,
    cells: list[str],
    *,
    name: str = "run",
    timeout_s: float = TIMEOUT_S,
    report_dir: Path | None = None,
) -> tuple[subprocess.Popen, Path, Path]:
    """A grid in its own process (`python -m tests.runner_cells`), with a private TMPDIR
    so that whatever it leaves behind there can be seen."""
    markers, scratch = tmp / f"{name}-markers", tmp / f"{name}-tmp"
    markers.mkdir()
    scratch.mkdir()
    report_dir = report_dir or tmp / "report"
    argv = [str(report_dir), str(markers), str(timeout_s), *cells]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.runner_cells", *argv],
        cwd=REPO_ROOT,
        env={**os.environ, "TMPDIR": str(scratch)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_interruptible,
    )
    return proc, markers, scratch


def _interruptible() -> None:
    """The grid takes Ctrl-C as a foreground `python -m bench` does. A suite started in the
    background of a shell without job control (`make test &`) inherits SIGINT ignored,
    and so would the grid: the SIGINT test then saw the run go on to its next cell."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def finish(proc: subprocess.Popen, markers: Path, scratch: Path) -> tuple[int, str]:
    """Wait for the run; check it left no rank and nothing in its TMPDIR; (exit, output)."""
    out, err = proc.communicate(timeout=120)
    pids = rank_pids(markers)
    wait_until(lambda: not any(map(is_running, pids.values())), 10, "the ranks to exit")
    assert not list(scratch.iterdir()), f"left behind in TMPDIR: {list(scratch.iterdir())}"
    return proc.returncode, out + err


def statuses(report_dir: Path) -> dict[str, str]:
    df = ResultStore(report_dir, ["cell"]).read()
    return dict(zip(df["cell"], df["status"], strict=True))


def left_in(report_dir: Path) -> set[str]:
    return {p.name for p in report_dir.iterdir()}


# --- faults of ranks and cells, in one grid --------------------------------------------------


def test_rank_faults_fail_their_cell_and_the_run(tmp_path):
    proc, markers, scratch = start(tmp_path, ["a:ok", "k:kill9", "s:stop", "w:wrong", "b:ok"])
    code, output = finish(proc, markers, scratch)
    report_dir = tmp_path / "report"
    assert code == 1, output
    assert "runner_faults: 2 ok, 2 failed, 1 wrong" in output
    assert statuses(report_dir) == {
        "a": "ok",
        "k": "failed",
        "s": "failed",
        "w": "wrong",
        "b": "ok",
    }
    errors = ResultStore(report_dir, ["cell"]).read().set_index("cell")["error"]
    assert "rank 1" in errors["k"] and "-9" in errors["k"], errors["k"]
    assert f"timed out after {TIMEOUT_S:g} s" in errors["s"]
    assert "wrong=3" in errors["w"]
    assert left_in(report_dir) == REPORT_FILES
    headline = json.loads((report_dir / "headline.json").read_text())
    assert headline["failed_cells"] == 2 and headline["wrong_cells"] == 1


def test_a_grid_whose_every_cell_fails_still_reports(tmp_path):
    proc, markers, scratch = start(tmp_path, ["x:raise", "y:exit"])
    code, output = finish(proc, markers, scratch)
    report_dir = tmp_path / "report"
    assert code == 1 and "runner_faults: 0 ok, 2 failed, 0 wrong" in output, output
    assert "Traceback" not in output
    assert statuses(report_dir) == {"x": "failed", "y": "failed"}
    assert "## Failed cells (2)" in (report_dir / "report.md").read_text()
    assert left_in(report_dir) == REPORT_FILES


# --- the parent interrupted -----------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_parent_keeps_finished_rows_and_leaves_nothing(tmp_path, signum):
    proc, markers, scratch = start(tmp_path, ["a:ok", "h:hang", "c:ok"], timeout_s=60)
    wait_until(lambda: len(rank_pids(markers)) == 4, 60, "cell h to start on both ranks")
    proc.send_signal(signum)
    code, output = finish(proc, markers, scratch)
    assert code == 128 + signum, output  # as a shell reports a signal's end
    assert "Traceback" not in output and "resume=true" in output, output
    assert statuses(tmp_path / "report") == {"a": "ok"}  # finished rows kept
    assert left_in(tmp_path / "report") == {"results.csv"}  # no lock, no temporary file


# --- two runs, one report_dir ---------------------------------------------------------------


def test_a_second_run_into_a_report_dir_in_use_is_refused(tmp_path):
    # The first run's hung cell must outlast the second run's start (importing torch on a
    # loaded 2-core CI host took longer than a 4 s cell timeout once, and the first run had
    # finished before the second looked): it hangs until this test kills one of its ranks.
    first, markers, scratch = start(tmp_path, ["a:ok", "h:hang"], name="first", timeout_s=100)
    wait_until(lambda: len(rank_pids(markers)) == 4, 60, "the first run's cell h to start")
    second, markers2, scratch2 = start(tmp_path, ["z:ok"], name="second")
    code2, output2 = finish(second, markers2, scratch2)
    assert first.poll() is None, "the first run ended before the second one was judged"
    assert code2 == 2 and "is in use by another run" in output2, output2
    assert len(output2.strip().splitlines()) == 1 and not rank_pids(markers2)
    os.kill(rank_pids(markers)["h.rank1"], signal.SIGKILL)
    code, output = finish(first, markers, scratch)
    assert code == 1, output  # h lost a rank
    assert statuses(tmp_path / "report") == {"a": "ok", "h": "failed"}


# --- what is refused before any cell runs ---------------------------------------------------

HEADER = "cell,pids,wrong,status,error\n"
CORRUPTED = {  # kind -> (results.csv bytes, the line the refusal names, words it says)
    "garbage line": (HEADER + "a,1 2,0,ok,\n%%%% garbage\n", 3, "fields"),
    "truncated key": (HEADER + "a,1 2,0,ok,\nb\n", 3, "fields"),
    "malformed row": (HEADER + 'a,"1 2,0,ok,\n', 2, ""),
    "unknown status": (HEADER + "a,1 2,0,done,\n", 2, "status='done'"),
    "another table": ("algorithm,world_size,status\nring,2,ok\n", 1, "no cell column"),
    "empty file": ("", 1, "empty file"),
    "not text": ("cell,status\n\xff\xfe,ok\n", 2, ""),
}


def run_fake(report_dir: Path, markers: Path, cells: list[str], *, resume=False, setting=0):
    markers.mkdir(parents=True, exist_ok=True)
    cfg = FakeConfig(cells=cells, marker_dir=str(markers), timeout_s=TIMEOUT_S, setting=setting)
    return run_experiment(
        fake_experiment(),
        cfg,
        report_dir=report_dir,
        cluster=LOCAL,
        resume=resume,
        wandb_cfg=WandbConfig(mode="disabled"),
    )


@pytest.mark.parametrize("kind", list(CORRUPTED))
def test_a_corrupted_results_csv_is_refused_untouched(tmp_path, kind):
    text, line, words = CORRUPTED[kind]
    report_dir = tmp_path / "report"
    report_dir.mkdir()
    path = report_dir / "results.csv"
    data = text.encode("latin-1")
    path.write_bytes(data)
    with pytest.raises(ValueError, match=f"{path}:{line}: ") as refused:
        run_fake(report_dir, tmp_path / "markers", ["a:ok"], resume=True)
    assert words in str(refused.value) and "\n" not in str(refused.value)
    assert path.read_bytes() == data and left_in(report_dir) == {"results.csv"}
    assert not rank_pids(tmp_path / "markers")


def test_a_last_line_cut_at_any_byte_is_never_taken_as_finished(tmp_path):
    # A row's last field is its row_check: wherever the line is cut (a full disk, a copy
    # stopped short), the row is refused, never read as an ok row with a shortened value.
    store = ResultStore(tmp_path, ["cell"])
    store.write(
        [
            {"cell": "a", "status": "ok", "time_s": 0.25, "error": ""},
            {"cell": "b", "status": "ok", "time_s": 1.5, "error": 'none, "quoted"'},
        ]
    )
    data = store.path.read_bytes()
    store.check("runner_faults")  # whole, it passes
    last = data.rstrip(b"\n").rfind(b"\n") + 1
    for end in range(last + 1, len(data) - 1):
        store.path.write_bytes(data[:end] + b"\n")
        with pytest.raises(ValueError, match=f"{store.path}:3: "):
            store.check("runner_faults")


def test_an_empty_grid_is_refused_before_work(tmp_path):
    # An empty report with exit status 0 would read as a run that worked.
    with pytest.raises(ValueError, match="the grid has no cells"):
        run_fake(tmp_path / "report", tmp_path / "markers", [])
    assert not (tmp_path / "report").exists()


@pytest.mark.parametrize("case", ["a file", "another experiment's", "results.csv a link"])
def test_a_report_dir_that_cannot_hold_the_results_is_refused(tmp_path, case):
    report_dir, victim = tmp_path / "report", tmp_path / "victim.txt"
    victim.write_text("mine")
    if case == "a file":
        report_dir.write_text("not a directory")
        needle = "is a file"
    elif case == "another experiment's":
        report_dir.mkdir()
        (report_dir / "headline.json").write_text('{"experiment": "collectives"}')
        needle = "holds the results of experiment collectives"
    else:
        report_dir.mkdir()
        (report_dir / "results.csv").symlink_to(victim)
        needle = "not a regular file"
    with pytest.raises(ValueError, match=needle):
        run_fake(report_dir, tmp_path / "markers", ["a:ok"])
    assert not rank_pids(tmp_path / "markers") and victim.read_text() == "mine"


def _bad_path(tmp: Path, case: str) -> tuple[Path, str]:
    """A report_dir that cannot hold a run's files, and the words its refusal says."""
    if case == "under a file":
        (tmp / "file").write_text("mine")
        return tmp / "file" / "report", "a part of the path is a file"
    if case == "symlink loop":
        (tmp / "loop").symlink_to(tmp / "loop")
        return tmp / "loop" / "report", "too many levels of symbolic links"
    if case == "name too long":
        return tmp / ("x" * 300), "file name too long"
    if case == "under /proc":
        return Path("/proc/distbench-report"), "cannot write here"
    report_dir = tmp / "report"
    report_dir.mkdir()
    if case == "headline.json a FIFO":
        os.mkfifo(report_dir / "headline.json")  # reading it would block the run forever
        return report_dir, "headline.json is a FIFO"
    name = "headline.json" if case == "headline.json a directory" else ".results.csv.lock"
    (report_dir / name).mkdir()
    return report_dir, f"{name} is a directory"


PATH_CASES = [
    "under a file",
    "symlink loop",
    "name too long",
    "under /proc",
    "headline.json a FIFO",
    "headline.json a directory",
    "lock file a directory",
]


@pytest.mark.parametrize("case", PATH_CASES)
def test_a_report_dir_path_that_cannot_work_is_refused_in_one_line(tmp_path, case):
    report_dir, words = _bad_path(tmp_path, case)
    before = sorted(tmp_path.rglob("*")) if case != "symlink loop" else None
    with pytest.raises(ValueError) as refused:
        run_fake(report_dir, tmp_path / "markers", ["a:ok"])
    message = str(refused.value)
    assert words in message and "\n" not in message, message
    assert str(report_dir)[:60] in message
    assert not rank_pids(tmp_path / "markers")
    if before is not None:  # nothing created (the markers folder is run_fake's own)
        assert [p for p in sorted(tmp_path.rglob("*")) if "markers" not in p.parts] == before


@pytest.mark.parametrize("error", ["ENOSPC", "EROFS"])
def test_a_file_system_failing_mid_run_is_one_line(tmp_path, error):
    # The disk fills (or the mount turns read-only) while a row is written: one line
    # naming the file and the problem, exit 1, no traceback (chained or not).
    script = (
        "import errno, os, sys; import bench.runner as runner\n"
        "def full(*a, **k):\n"
        f"    raise OSError(errno.{error}, os.strerror(errno.{error}), '{tmp_path}/results.csv')\n"
        "runner.run_experiment = full\n"
        "from bench.app import main; main()\n"
    )
    argv = [
        "experiment=collectives",
        "profile=ci",
        "wandb.mode=disabled",
        f"report_dir={tmp_path}",
        f"hydra.run.dir={tmp_path / 'hydra'}",
    ]
    done = subprocess.run(
        [sys.executable, "-c", script, *argv],
        cwd=REPO_ROOT,
        text=True,
        capture_output=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in output, output
    assert f"cannot write {tmp_path}/results.csv" in output and "resume=true" in output, output


# --- what a run writes, and what resume skips ------------------------------------------------


def test_links_are_replaced_not_written_through_and_resume_follows_settings(tmp_path):
    report_dir = tmp_path / "report"
    report_dir.mkdir()
    before = {p.pid for p in multiprocessing.active_children()}  # other tests' pools
    victims = {}
    for name in ("report.md", "headline.json"):
        victims[name] = tmp_path / f"victim-{name}"
        victims[name].write_text("mine")
        (report_dir / name).symlink_to(victims[name])
    run_fake(report_dir, tmp_path / "m0", ["a:ok", "b:ok"])
    assert all(v.read_text() == "mine" for v in victims.values())
    assert not any((report_dir / name).is_symlink() for name in victims)
    assert left_in(report_dir) == REPORT_FILES

    run_fake(report_dir, tmp_path / "m1", ["a:ok", "b:ok"], resume=True)
    assert not rank_pids(tmp_path / "m1")  # same settings: nothing measured again
    df = run_fake(report_dir, tmp_path / "m2", ["a:ok"], resume=True, setting=1)
    assert sorted(rank_pids(tmp_path / "m2")) == ["a.rank0", "a.rank1"]  # other settings
    assert list(df["cell"]) == ["a"] and list(statuses(report_dir)) == ["a"]
    headline = json.loads((report_dir / "headline.json").read_text())
    assert headline["settings"]["setting"] == 1 and len(headline["settings_hash"]) == 1
    assert {p.pid for p in multiprocessing.active_children()} <= before  # every pool closed
