"""ResultStore and run_metadata: the tidy results.csv every report is built from.

A failure here means a grid could lose or duplicate finished cells, re-run cells it has
already measured (or skip ones that failed), corrupt results.csv when interrupted or when
Hydra multirun jobs write at once, or publish rows without saying where they came from.
"""

from __future__ import annotations

import io
import multiprocessing
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from bench.provenance import git_sha
from bench.results import ResultStore, read_results, run_metadata

KEYS = ["world_size", "algorithm", "lr"]


def row(world_size: int, algorithm: str, lr: float, status: str = "ok", **extra) -> dict:
    return {"world_size": world_size, "algorithm": algorithm, "lr": lr, "status": status, **extra}


def test_empty_store_reads_as_empty(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "exp", KEYS)
    assert store.path == tmp_path / "exp" / "results.csv"
    assert store.read().empty
    assert store.finished_keys() == set()


def test_write_upserts_by_key(tmp_path: Path) -> None:
    store = ResultStore(tmp_path, KEYS)
    store.write([row(2, "ring", 0.1, time_s=1.5), row(4, "ring", 0.1, time_s=2.5)])
    store.write([row(2, "ring", 0.1, time_s=9.0), row(8, "tree", 1.0, time_s=3.0, extra=7)])
    table = store.read()
    assert list(table.columns) == [*KEYS, "status", "time_s", "extra"]
    # The replaced row keeps its place; the new key is appended.
    assert table[["world_size", "algorithm", "lr", "time_s"]].values.tolist() == [
        [2, "ring", 0.1, 9.0],
        [4, "ring", 0.1, 2.5],
        [8, "tree", 1.0, 3.0],
    ]
    assert table["extra"].isna().tolist() == [True, True, False]


def test_keys_survive_the_csv_round_trip(tmp_path: Path) -> None:
    store = ResultStore(tmp_path, KEYS)
    # An int and a float in one column would make pandas write the int as "2.0".
    store.write([row(2, "ring", 1), row(3, "007", 1e-5), row(4, "NA", 0.5)])
    # A numeric-looking string key comes back as a number: compare through key_of.
    assert store.finished_keys() == {(2, "ring", 1), (3, 7, 1e-5), (4, "NA", 0.5)}
    assert (2, "ring", 1.0) in store.finished_keys()
    assert store.key_of(row(3, "007", 1e-5)) in store.finished_keys()
    assert store.path.read_text().splitlines()[1].startswith("2,ring,1,")
    # Writing the same keys again replaces rather than duplicates.
    store.write([row(2, "ring", 1.0), row(3, "007", 0.00001)])
    assert len(store.read()) == 3
    assert store.read()["algorithm"].tolist() == ["ring", "007", "NA"]


def test_commit_and_id_columns_stay_text(tmp_path: Path) -> None:
    # "8e25226" reads as the float 8e25226 (inf) and "1234567" as an int unless these
    # columns are read as text; the report would then say git_sha "inf".
    store = ResultStore(tmp_path, KEYS)
    store.write(
        [
            row(
                2,
                "ring",
                0.1,
                git_sha="8e25226",
                source_git_sha="1234567",
                run_id="0012",
                settings_hash="1e5",
                time_s=1.5,
            )
        ]
    )
    for table in (store.read(), read_results(store.path)):
        got = table.iloc[0]
        assert (got["git_sha"], got["source_git_sha"]) == ("8e25226", "1234567")
        assert (got["run_id"], got["settings_hash"]) == ("0012", "1e5")
        assert got["time_s"] == 1.5 and got["world_size"] == 2  # other columns stay typed


def test_finished_keys_skips_failed_rows(tmp_path: Path) -> None:
    store = ResultStore(tmp_path, KEYS)
    store.write([row(2, "ring", 0.1), row(4, "ring", 0.1, status="failed", error="boom")])
    assert store.finished_keys() == {(2, "ring", 0.1)}
    store.write([row(4, "ring", 0.1)])  # the resumed run fixes it
    assert store.finished_keys() == {(2, "ring", 0.1), (4, "ring", 0.1)}


def test_rows_without_a_key_column_are_refused(tmp_path: Path) -> None:
    store = ResultStore(tmp_path, KEYS)
    with pytest.raises(KeyError, match="algorithm"):
        store.write([{"world_size": 2, "lr": 0.1}])
    assert not store.path.exists()


def test_failed_write_leaves_previous_file_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ResultStore(tmp_path, KEYS)
    store.write([row(2, "ring", 0.1, time_s=1.0)])
    before = store.path.read_bytes()
    real_to_csv = pd.DataFrame.to_csv

    def torn_to_csv(frame: pd.DataFrame, target=None, *args, **kwargs):
        if isinstance(target, io.StringIO):  # in-memory formatting of the new rows
            return real_to_csv(frame, target, *args, **kwargs)
        target.write("world_size,algo")  # the file write dies halfway
        raise OSError("disk full")

    monkeypatch.setattr(pd.DataFrame, "to_csv", torn_to_csv)
    with pytest.raises(OSError, match="disk full"):
        store.write([row(2, "ring", 0.1, time_s=5.0), row(4, "ring", 0.1)])
    monkeypatch.undo()
    assert store.path.read_bytes() == before
    # The temporary file is cleaned up; only the lock file stays beside results.csv.
    assert sorted(p.name for p in tmp_path.iterdir()) == [".results.csv.lock", "results.csv"]


def write_many(report_dir: str, writer: int, count: int, barrier) -> None:
    """Run in a separate process: `count` single-row writes with keys unique to `writer`."""
    store = ResultStore(report_dir, KEYS)
    barrier.wait()
    for i in range(count):
        store.write([row(writer, f"algo{i}", 0.5, writer=writer)])


def test_concurrent_writers_both_land(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    writers = [ctx.Process(target=write_many, args=(str(tmp_path), w, 20, barrier)) for w in (1, 2)]
    for proc in writers:
        proc.start()
    for proc in writers:
        proc.join(60)
    assert [proc.exitcode for proc in writers] == [0, 0]
    store = ResultStore(tmp_path, KEYS)
    expected = {(w, f"algo{i}", 0.5) for w in (1, 2) for i in range(20)}
    assert store.finished_keys() == expected
    assert len(store.read()) == 40


def test_run_metadata_has_every_key() -> None:
    meta = run_metadata(backend="gloo", device="cpu", world_size=4)
    assert set(meta) == {
        "git_sha",
        "torch_version",
        "backend",
        "device",
        "host",
        "world_size",
        "timestamp",
        "host_cores",
        "python_version",
    }
    assert (meta["backend"], meta["device"], meta["world_size"]) == ("gloo", "cpu", 4)
    assert meta["timestamp"].endswith("+00:00")
    assert meta["git_sha"]


def test_git_sha_marks_a_dirty_tree(tmp_path: Path) -> None:
    assert git_sha(tmp_path) == "unknown"  # not a repository

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    (tmp_path / "impls").mkdir()
    (tmp_path / "impls" / "code.py").write_text("x = 1\n")
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "results.csv").write_text("a\n1\n")
    git("add", ".")
    git("commit", "-q", "-m", "init")
    clean = git_sha(tmp_path)
    assert clean != "unknown" and not clean.endswith("+dirty")
    (tmp_path / "reports" / "results.csv").write_text("a\n2\n")  # regenerated reports
    (tmp_path / "untracked.txt").write_text("new\n")  # not measuring code
    (tmp_path / "notes.md").write_text("docs\n")
    assert git_sha(tmp_path) == clean
    (tmp_path / "impls" / "code.py").write_text("x = 2\n")
    assert git_sha(tmp_path) == f"{clean}+dirty"
    git("checkout", "--", "impls/code.py")
    (tmp_path / "impls" / "new_module.py").write_text("y = 1\n")  # new, untracked code
    assert git_sha(tmp_path) == f"{clean}+dirty"


def test_a_key_column_added_later_reads_older_files_at_its_default(tmp_path: Path) -> None:
    """An experiment that gains a key column (pipeline_utilization's `slicing`) still reads,
    resumes and extends a results.csv written before it: old rows stand for the default."""
    ResultStore(tmp_path, KEYS).write([row(2, "ring", 0.1, time_s=1.0)])
    store = ResultStore(tmp_path, [*KEYS, "cut"], key_defaults={"cut": "equal"})
    store.check("exp")  # not refused as another experiment's file
    assert store.read()["cut"].tolist() == ["equal"]
    assert store.finished_keys() == {(2, "ring", 0.1, "equal")}
    store.write([row(2, "ring", 0.1, cut="equal", time_s=5.0), row(2, "ring", 0.1, cut="alpa")])
    table = store.read()
    assert table[["cut", "time_s"]].fillna(0).values.tolist() == [["equal", 5.0], ["alpa", 0]]
    # Without the default the same file is another experiment's.
    plain = tmp_path / "plain"
    ResultStore(plain, KEYS).write([row(2, "ring", 0.1)])
    with pytest.raises(ValueError, match="no cut column"):
        ResultStore(plain, [*KEYS, "cut"]).check("exp")
