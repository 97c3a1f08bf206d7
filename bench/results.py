"""Tidy results: one CSV per experiment, written atomically, resumable, with run metadata.

`ResultStore` keeps ``<report_dir>/results.csv`` with one row per measured configuration
(a *cell*), identified by its key columns. Every write reads the file, upserts the new
rows by key and replaces the file atomically (a temporary file of a unique name in the same
directory, then ``os.replace``, which replaces a planted link instead of writing through
it) while holding an ``fcntl`` lock, so an interrupted grid loses no finished cell and
Hydra multirun jobs writing at the same time do not clobber each other.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import hashlib
import io
import json
import math
import numbers
import os
import platform
import re
import socket
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from bench.config import check_directory
from bench.provenance import git_sha

__all__ = [
    "MEASURED",
    "ROW_CHECK",
    "STATUSES",
    "TEXT_COLUMNS",
    "ResultStore",
    "read_results",
    "run_metadata",
    "settings_hash",
    "with_row_check",
]

_INT_TEXT = re.compile(r"[+-]?\d+")
# A row's status: measured and checked ("ok"), measured but off its reference ("wrong":
# `wrong > 0`), or no measurement at all ("failed": raised, crashed or timed out).
STATUSES = ("ok", "wrong", "failed")
MEASURED = ("ok", "wrong")
# Columns that are text whatever they look like: a commit such as "8e25226" or "1234567"
# would otherwise come back as a float (inf) or an int when results.csv is read.
TEXT_COLUMNS = (
    "git_sha",
    "source_git_sha",
    "run_id",
    "settings_hash",
    "host",
    "timestamp",
    "torch_version",
    "python_version",
    "status",
    "error",
)
# The files a run writes into its report_dir (plots and traces aside).
REPORT_FILES = ("results.csv", "report.md", "headline.json")
_FIX = "fix or delete that line, or move the file away (nothing was overwritten)"
# The last column of every row: a hash of the row's other fields, so a line cut inside its
# last field (a full disk, a copy stopped short, an editor) is refused, not taken as a
# finished row with a shortened value. Files written before it existed have no such column.
ROW_CHECK = "row_check"


def row_check(fields: Sequence[str]) -> str:
    """The `ROW_CHECK` value of a row whose other fields are `fields`, in header order."""
    return hashlib.sha256("\x1f".join(fields).encode()).hexdigest()[:8]


def settings_hash(settings: Mapping[str, Any]) -> str:
    """A short stable hash of the settings that change a measurement (JSON, sorted keys)."""
    text = json.dumps(settings, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def run_metadata(*, backend: str, device: str, world_size: int | None = None) -> dict[str, Any]:
    """The columns every results.csv row carries to say where and how it was measured."""
    import torch  # deferred: report writers read metadata without needing torch loaded

    return {
        "git_sha": git_sha(),
        "torch_version": torch.__version__,
        "backend": backend,
        "device": device,
        "host": socket.gethostname(),
        "world_size": world_size,
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host_cores": os.cpu_count(),
        "python_version": platform.python_version(),
    }


def _key_text(value: Any) -> str:
    """The text a key value has in the CSV, whatever its type on the way in."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, bool | str):
        return str(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return repr(float(value))  # what pandas writes: "0.1", "1.0", "1e-05"
    return str(value)


def _parse_key_text(text: str) -> Any:
    """Back from CSV text to a Python value: None, bool, int, float, else the string."""
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    if _INT_TEXT.fullmatch(text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text


def read_results(path: str | Path) -> pd.DataFrame:
    """A results.csv as a typed frame: numbers where the text is a number, except in
    `TEXT_COLUMNS`; only empty cells are missing (a string key such as "NA" stays a string)."""
    with open(path, newline="") as handle:
        header = next(csv.reader(handle), [])
    text = {name: str for name in TEXT_COLUMNS if name in header}
    table = pd.read_csv(path, keep_default_na=False, na_values=[""], dtype=text)
    return table.drop(columns=ROW_CHECK, errors="ignore")


def _read_text(path: Path) -> pd.DataFrame:
    """The CSV with every cell as its exact text, so rewriting it changes no old value."""
    return pd.read_csv(path, dtype=str, keep_default_na=False).drop(
        columns=ROW_CHECK, errors="ignore"
    )


def with_row_check(table: pd.DataFrame) -> pd.DataFrame:
    """`table` (results.csv as text) with its `ROW_CHECK` column recomputed, last."""
    table = table.drop(columns=ROW_CHECK, errors="ignore")
    rows = table.itertuples(index=False)
    table[ROW_CHECK] = [row_check(["" if pd.isna(v) else str(v) for v in r]) for r in rows]
    return table


class ResultStore:
    """One experiment's results.csv: one row per cell, identified by `key_columns`.

    `ResultStore.check` is the preflight a run passes before any rank starts: report_dir is a
    directory, holds no other experiment's results, and its results.csv parses (a corrupted
    file is refused with its path and line, and left as it is). `ResultStore.claim` holds the
    report directory for one run (or the jobs of one sweep) until it ends: a second run into
    it is refused instead of mixing, or dropping, the first one's rows.

    Key values are compared in their CSV form: an int key ``2`` is written ``2`` and reads back
    as ``2``, a float ``0.5`` as ``0.5``, ``None`` as an empty cell. `ResultStore.key_of`
    gives the canonical key tuple of a row, the same form `finished_keys` returns.
    """

    def __init__(
        self,
        report_dir: str | Path,
        key_columns: Sequence[str],
        key_defaults: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(key_columns, str) or not key_columns:
            raise ValueError(f"key_columns must be a non-empty list of names, got {key_columns!r}")
        self.report_dir = Path(report_dir)
        self.key_columns = list(key_columns)
        self.key_defaults = dict(key_defaults or {})
        """Key columns added after results files existed: the value a row of an older file,
        which lacks the column, stands for."""

    def _fill(self, table: pd.DataFrame, text: bool = False) -> pd.DataFrame:
        """`table` with every defaulted key column it lacks, at its default."""
        for column, value in self.key_defaults.items():
            if column not in table.columns:
                table[column] = _key_text(value) if text else value
        return table

    @property
    def path(self) -> Path:
        return self.report_dir / "results.csv"

    @property
    def lock_path(self) -> Path:
        return self.report_dir / ".results.csv.lock"

    def read(self) -> pd.DataFrame:
        """The results as a typed frame; an empty frame with the key columns if none yet."""
        if not self.path.exists():
            return pd.DataFrame(columns=self.key_columns)
        return self._fill(read_results(self.path))

    def key_of(self, row: Mapping[str, Any] | Sequence[Any]) -> tuple:
        """The canonical key of a row (a mapping) or of key values in key-column order."""
        if isinstance(row, Mapping):
            missing = [k for k in self.key_columns if k not in row]
            if missing:
                raise KeyError(f"row lacks key column(s) {missing}; keys are {self.key_columns}")
            values = [row[k] for k in self.key_columns]
        else:
            values = list(row)
            if len(values) != len(self.key_columns):
                raise ValueError(
                    f"expected {len(self.key_columns)} key values {self.key_columns}, "
                    f"got {values!r}"
                )
        return tuple(_parse_key_text(_key_text(v)) for v in values)

    def finished_keys(self, settings: str | None = None) -> set[tuple]:
        """Keys of the rows whose ``status`` is ``"ok"`` (cells a resumed grid may skip);
        with `settings`, only rows measured with that `settings_hash`."""
        if not self.path.exists():
            return set()
        table = self._fill(_read_text(self.path), text=True)
        if "status" not in table.columns:
            return set()
        done = table[table["status"] == "ok"]
        if settings is not None:
            hashes = done["settings_hash"] if "settings_hash" in done.columns else ""
            done = done[hashes == settings]
        columns = [done[k] if k in done.columns else [""] * len(done) for k in self.key_columns]
        return {tuple(_parse_key_text(text) for text in key) for key in zip(*columns, strict=True)}

    def write(
        self, rows: Sequence[Mapping[str, Any]], keep: Callable[[dict], bool] | None = None
    ) -> int:
        """Upsert `rows` by key: a row replaces the stored row with its key, in place;
        rows with new keys are appended. Columns: key columns first, then in first-seen order.
        With `keep`, stored rows it refuses (given each as its CSV text) are dropped in the
        same replacement. Returns how many were dropped.
        """
        for row in rows:
            self.key_of(row)  # fail on a missing key column before touching the file
        if not rows and keep is None:
            return 0
        new = self._as_text(rows) if rows else pd.DataFrame(columns=self.key_columns)
        self.report_dir.mkdir(parents=True, exist_ok=True)
        with self.locked():
            exists = self.path.exists()
            old = self._fill(_read_text(self.path), text=True) if exists else pd.DataFrame()
            dropped = 0
            if keep is not None and len(old):
                kept = [keep(record) for record in old.to_dict("records")]
                dropped = len(kept) - sum(kept)
                old = old[kept]
            if rows or dropped:
                self._replace(self._merge(old, new))
            return dropped

    def text_key(self, record: Mapping[str, str]) -> tuple:
        """The canonical key of a row read as CSV text (what `write`'s `keep` is given)."""
        return self._text_key(record)

    def _as_text(self, rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
        """New rows as text, exactly as pandas would write them, keys canonicalised."""
        records = [{**row, **{k: _key_text(row[k]) for k in self.key_columns}} for row in rows]
        buffer = io.StringIO()
        pd.DataFrame.from_records(records).to_csv(buffer, index=False)
        buffer.seek(0)
        return pd.read_csv(buffer, dtype=str, keep_default_na=False)

    def _merge(self, old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
        columns = list(self.key_columns)
        for column in [*old.columns, *new.columns]:
            if column not in columns:
                columns.append(column)
        old = old.reindex(columns=columns, fill_value="")
        new = new.reindex(columns=columns, fill_value="")
        new_by_key = {self._text_key(r): r for r in new.to_dict("records")}  # last one wins
        merged = []
        for record in old.to_dict("records"):
            merged.append(new_by_key.pop(self._text_key(record), record))
        merged.extend(new_by_key.values())
        return pd.DataFrame(merged, columns=columns, dtype=str)

    def _text_key(self, record: Mapping[str, str]) -> tuple:
        # Parsed, so "1" and "1.0" written by different writers name the same cell.
        return tuple(_parse_key_text(record[k]) for k in self.key_columns)

    def _replace(self, table: pd.DataFrame) -> None:
        """Write `table` to a temporary file next to results.csv, then swap it in."""
        table = with_row_check(table)
        fd, tmp_name = tempfile.mkstemp(dir=self.report_dir, prefix=".results.", suffix=".tmp")
        try:
            # mkstemp makes the file private (0600); keep the mode results.csv had.
            mode = self.path.stat().st_mode & 0o777 if self.path.exists() else 0o644
            os.fchmod(fd, mode)
            with os.fdopen(fd, "w", newline="") as handle:
                table.to_csv(handle, index=False)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp_name, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp_name)
            raise

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        # A separate lock file: results.csv itself is replaced, so a lock on it would be lost.
        with open(self.lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def check(self, experiment: str) -> None:
        """The preflight of a run into this directory, before any rank starts: a
        ValueError, one line naming the file, if it cannot hold this experiment's results.
        Reads only: a refused directory is left exactly as it was."""
        where = f"report_dir={self.report_dir}"
        check_directory("report_dir", self.report_dir)
        for name in (*REPORT_FILES, self.lock_path.name):
            path = self.report_dir / name
            with contextlib.suppress(FileNotFoundError):
                mode = path.lstat().st_mode
                if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
                    kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO, socket or device"
                    raise ValueError(f"{path} is {kind}, where the run writes a file; move it away")
        other = _experiment_of(self.report_dir / "headline.json")
        if other not in (None, experiment):
            raise ValueError(
                f"{where} holds the results of experiment {other}; give "
                f"{experiment} a report_dir of its own"
            )
        if self.path.is_symlink() or (self.path.exists() and not self.path.is_file()):
            raise ValueError(f"{self.path} is not a regular file; move it away")
        if self.path.exists():
            self._check_rows()

    def _check_rows(self) -> None:
        """Every line of results.csv a row of this experiment's table (see `check`)."""
        data = self.path.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            line = data[: error.start].count(b"\n") + 1
            raise ValueError(
                f"{self.path}:{line}: not UTF-8 text ({error.reason}); {_FIX}"
            ) from None
        reader = csv.reader(io.StringIO(text, newline=""))
        try:
            self._check_table(reader)
        except csv.Error as error:
            raise ValueError(f"{self.path}:{reader.line_num}: {error}; {_FIX}") from None

    def _check_table(self, reader) -> None:
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{self.path}:1: empty file, no header line; {_FIX}")
        wanted = [c for c in self.key_columns if c not in self.key_defaults]
        missing = [c for c in [*wanted, "status"] if c not in header]
        if missing:
            raise ValueError(
                f"{self.path}:1: the header has no {', '.join(missing)} column: "
                "not this experiment's results; move it away, or give another "
                "report_dir"
            )
        status = header.index("status")
        checked = header[-1] == ROW_CHECK
        for fields in reader:
            if not fields:
                continue  # a blank line: pandas skips it too
            line = f"{self.path}:{reader.line_num}"
            if len(fields) != len(header):
                raise ValueError(
                    f"{line}: {len(fields)} fields where the header has "
                    f"{len(header)} (a truncated or foreign line); {_FIX}"
                )
            if checked and row_check(fields[:-1]) != fields[-1]:
                raise ValueError(
                    f"{line}: its {ROW_CHECK} does not match its fields (a line "
                    f"cut short or edited); {_FIX}"
                )
            if fields[status] not in STATUSES:
                raise ValueError(
                    f"{line}: status={fields[status]!r} is none of {', '.join(STATUSES)}; {_FIX}"
                )

    @contextlib.contextmanager
    def claim(self, *, shared: bool = False) -> Iterator[None]:
        """Hold the report directory for one run (`shared`: for the jobs of one sweep, which
        write rows of one grid), refusing with a ValueError while another run holds it.
        The claim is an `flock` on the directory itself, so a killed run leaves nothing
        behind; the run that ends last removes the writers' lock file."""
        try:
            self.report_dir.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.report_dir):
                pass  # can files be made here? (root passes permission checks; not /proc)
            fd = os.open(self.report_dir, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as error:
            raise ValueError(
                f"report_dir={self.report_dir}: cannot write here ({error.strerror.lower()})"
            ) from None
        try:
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ValueError(
                    f"report_dir={self.report_dir} is in use by another run "
                    "until it ends; wait for it, or give another report_dir"
                ) from None
            yield
        finally:
            with contextlib.suppress(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # no other run holds it now
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.lock_path)
            os.close(fd)


def _experiment_of(headline: Path) -> str | None:
    """The experiment a headline.json was written for (None when there is none to read)."""
    if not headline.is_file():  # absent, or not a file to read (a FIFO would block)
        return None
    try:
        return json.loads(headline.read_text()).get("experiment")
    except (OSError, ValueError, AttributeError):
        return None
