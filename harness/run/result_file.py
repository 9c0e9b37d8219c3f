"""Writing one leg's result file without ever losing or clobbering a result.

- **Locked.** A run holds an exclusive lock (``.<name>.lock`` beside the file, ``flock``) from start
  to end; a second run into the same file stops at once with a one-line error instead of racing it.
  The kernel drops the lock when the process ends, however it ends.
- **Kept as it goes.** Each case's rows are appended to ``<stem>.partial.csv`` (and fsync'd) as soon
  as the case is done. The finished run writes the result file atomically and removes the partial
  one. An interrupted run (Ctrl-C, a crash, a killed CI job) leaves the partial file: a readable
  result file of the cases done so far, which the gate fails as incomplete unless told
  ``--allow-missing``, and which ``--resume`` continues.
- **Never clobbered.** An existing result file of another suite or leg, a file that is not a result
  file, or a partial file of an interrupted run is not overwritten without ``--force``. Re-running
  the same suite and leg replaces its own earlier result: that is what a re-run is for.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from pathlib import Path

import pandas as pd

from harness.core.results import (PARTIAL_SUFFIX, ReportError, column_values, read_results, rows_to_frame,
                                   tracebacks_path, tracebacks_text, write_csv)


class OutDirError(ValueError):
    """An ``--out`` that cannot take the files (the message is the one-line error a command prints)."""


def writable_dir(path) -> Path:
    """The output directory, made and proven writable before any work (a bad --out must not cost a run)."""
    import tempfile

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutDirError(f"--out {path} is a file, not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise OutDirError(f"--out {path} is not a writable directory ({exc.strerror or exc})") from None
    return path

_RESUME_MUST_MATCH = ("leg", "mode", "suite", "git_commit", "versions", "settings")
"""The provenance a resumed run must share with its partial file: every column that keys a row (the leg's versions
and its settings: dot precision, reference method, the implementation, compiler options, ...)."""


def result_name(leg: str, *, tag: str | None = None, case_ids=(), ops=(), draws: int = 1,
                shard: str | None = None) -> str:
    """``<leg>[.<tag>][.<selection>][.draws-N][.shard-i-of-n].csv``. A run of part of a suite names its
    selection, so it can never replace the suite's own result file: ``.cases-<sha256[:8] of the sorted
    ids>`` for cases chosen by id, ``.op-<op>[+<op>]`` for cases chosen by op; a run over several input
    draws says how many."""
    parts = [leg] + ([tag] if tag else [])
    if case_ids:
        digest = hashlib.sha256("\n".join(sorted(case_ids)).encode()).hexdigest()[:8]
        parts.append(f"cases-{digest}")
    elif ops:
        parts.append("op-" + "+".join(sorted(set(ops))))
    if draws > 1:
        parts.append(f"draws-{draws}")
    if shard:
        i, n = shard.split("/")
        parts.append(f"shard-{i}-of-{n}")
    return ".".join(parts) + ".csv"


def lock_exclusively(path: Path):
    """An open lock file holding an exclusive ``flock`` for ``path`` (``.<name>.lock`` beside it); closing it
    releases the lock. Another run holding it is a one-line ReportError, at once."""
    lock_path = path.with_name(f".{path.name}.lock")
    lock = open(lock_path, "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise ReportError(f"another parity run is writing {path} right now (it holds {lock_path}); "
                          f"wait for it, or write elsewhere with --out or --tag") from None
    return lock


class ResultFile:
    """``with ResultFile(path, provenance, ...) as out:`` then ``out.append(rows)`` per case and
    ``out.finish()``; ``out.done`` holds the case ids a resumed run already has."""

    def __init__(self, path: Path, provenance: dict, *, force: bool = False, resume: bool = False):
        self.path = Path(path)
        self.partial = self.path.with_name(self.path.stem + PARTIAL_SUFFIX)
        self.tracebacks = tracebacks_path(self.path)  # the error rows' full tracebacks, appended with their case
        self.provenance, self.force, self.resume = provenance, force, resume
        self.done: set[str] = set()
        self.cut: str | None = None  # a resumed file's case whose write was cut inside: dropped, run again
        self._lock = None

    # ------------------------------------------------------------ checks
    def __enter__(self) -> "ResultFile":
        self._lock = lock_exclusively(self.path)
        try:
            self._check_target()
            self._check_partial()
        except BaseException:
            self._release()
            raise
        if not self.resume:  # a new result: the tracebacks of the one it replaces go with it
            self.tracebacks.unlink(missing_ok=True)
        return self

    def __exit__(self, *exc) -> None:
        self._release()

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing the descriptor drops the flock
            self._lock = None

    def _check_target(self) -> None:
        if self.force or not self.path.exists():
            return
        try:
            old = read_results(self.path)
        except ReportError as exc:
            raise ReportError(f"{self.path} exists and is not a result file this run may replace ({exc}); "
                              f"pass --force to overwrite it") from None
        clash = self._clash(old, ("leg", "suite"))
        if clash:
            column, theirs, ours = clash
            raise ReportError(f"{self.path} holds a result of {column} {theirs}, this run is {column} {ours}; "
                              f"pass --force to overwrite it, or write elsewhere with --out or --tag")

    def _check_partial(self) -> None:
        if not self.partial.exists():
            if self.resume:
                raise ReportError(f"nothing to resume: {self.partial} does not exist")
            return
        if self.force and not self.resume:
            self.partial.unlink()
            return
        if not self.resume:
            raise ReportError(f"{self.partial} holds the rows of an interrupted run: pass --resume to continue it, "
                              f"or --force to discard it")
        self.cut = _drop_a_cut_case(self.partial)
        rows = read_results(self.partial)
        clash = self._clash(rows, _RESUME_MUST_MATCH)
        if clash:
            column, theirs, ours = clash
            raise ReportError(f"cannot resume {self.partial}: it was made with {column} {theirs}, this run has "
                              f"{ours}; pass --force to start over")
        self.done = set(rows["case_id"])

    def _clash(self, rows: pd.DataFrame, columns) -> tuple[str, str, str] | None:
        """The first of ``columns`` whose values in ``rows`` are not this run's: (column, theirs, ours); for a JSON
        column (versions, settings) the first key whose values differ, as ``column.key``."""
        for column in columns:
            theirs, ours = column_values(rows, column), str(self.provenance.get(column) or "")
            if theirs and theirs != [ours]:
                return _first_difference(column, theirs, ours) or (column, ", ".join(theirs), ours or "(none)")
        return None

    # ------------------------------------------------------------ writing
    def append(self, rows: list[dict]) -> None:
        """One case's rows, appended whole and flushed to disk before the next case starts. A write that fails (a
        full disk, a file size limit) is cut back to the cases before it and raised as an OSError that names the
        file and says how to go on."""
        new = not self.partial.exists()
        text = rows_to_frame(rows).to_csv(index=False, header=new).encode()
        with open(self.partial, "ab") as f:
            whole = f.tell()
            try:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            except OSError as exc:
                with contextlib.suppress(OSError):
                    f.truncate(whole)  # no torn case: the file ends where the last whole case did
                raise OSError(exc.errno, f"{exc.strerror or exc}; the cases written before it are kept whole there: "
                                         "make room, then run the same command with --resume",
                              str(self.partial)) from None
        kept = tracebacks_text(rows)
        if kept:  # after the rows: a traceback never names a case the result file lacks
            with open(self.tracebacks, "a", encoding="utf-8") as f:
                f.write(kept)

    def finish(self) -> pd.DataFrame:
        """All rows (resumed ones included) as the result file, written atomically; the partial file goes."""
        if not self.partial.exists():
            raise ReportError("the run produced no rows")
        df = read_results(self.partial)
        write_csv(df, self.path)
        self.partial.unlink()
        return df


def fold_tracebacks(scratch: Path, path: Path) -> None:
    """The tracebacks of a scratch result file (the draws a gate asked for) appended to those of the result file
    its rows were folded into; the scratch one goes."""
    source = tracebacks_path(scratch)
    if source.exists():
        with open(tracebacks_path(path), "a", encoding="utf-8") as f:
            f.write(source.read_text(encoding="utf-8"))
        source.unlink()


def _drop_a_cut_case(partial: Path) -> str | None:
    """A partial file that does not end with a whole line had a case's write cut inside it (each case is one write;
    a failed write is cut back by :meth:`ResultFile.append`, so this is a machine that stopped mid-write). The
    torn line and every row of the last whole line's case go, so that case runs again (when the tear fell at a
    case's first line, that is the case before it, finished: it runs again too, nothing is lost). Returns the
    dropped case's id, or None when the file ends whole."""
    import csv

    data = partial.read_bytes()
    if not data or data.endswith(b"\n"):
        return None
    lines = data[:data.rfind(b"\n") + 1].splitlines(keepends=True)

    def case_of(line: bytes) -> str:
        return next(csv.reader([line.decode("utf-8", "replace")]), [""])[0]

    last = case_of(lines[-1]) if len(lines) > 1 else None
    while len(lines) > 1 and case_of(lines[-1]) == last:
        lines.pop()
    with open(partial, "r+b") as f:
        f.truncate(sum(map(len, lines)))
    return last


def _first_difference(column: str, theirs: list[str], ours: str) -> tuple[str, str, str] | None:
    """For JSON provenance (one value in the file): (``column.key``, their value, ours) of the first key whose
    values differ; None when either side is not a JSON object."""
    try:
        a, b = json.loads(theirs[0]), json.loads(ours)
    except (ValueError, IndexError):
        return None
    if len(theirs) != 1 or not isinstance(a, dict) or not isinstance(b, dict):
        return None
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            return f"{column}.{key}", json.dumps(a.get(key)), json.dumps(b.get(key))
    return None


def write_check_file(df: pd.DataFrame, path: Path, leg: str, *, force: bool = False) -> Path:
    """Write a check's rows (``parity causality``: one leg's causality and isolation rows) under the rules of
    a result file: locked while written; an existing file is replaced only when it holds this check of the
    same leg (a re-run), anything else only with ``force``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with lock_exclusively(path):
        if path.exists() and not force:
            try:
                old = pd.read_csv(path, usecols=["leg", "check"])
            except (ValueError, OSError, pd.errors.ParserError, pd.errors.EmptyDataError):
                raise ReportError(f"{path} exists and is not a check file this run may replace; pass --force to "
                                  f"overwrite it") from None
            theirs = sorted(set(old["leg"].dropna().astype(str)))
            if theirs and theirs != [leg]:
                raise ReportError(f"{path} holds the checks of leg {theirs[0]}, this run is leg {leg}; pass "
                                  f"--force to overwrite it, or write elsewhere with --out or --tag")
        return write_csv(df, path)

