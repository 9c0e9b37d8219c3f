"""The record: a sweep's verification keyed by content.

A sweep takes about 12 minutes, and its verdict is a function of a few things only: the code that captures and
checks (this package, the emulation it probes, the GPU leg and the ops it runs), the cases, the installed triton,
fla-core and torch, the targets and the emulation's facts. ``--reuse DIR`` serves a committed record of an earlier
sweep when, and only when, every one of those is unchanged; the key is computed here from the files and versions
(:mod:`harness.core.content_key`), never written by hand."""

from __future__ import annotations

import csv
import dataclasses
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from harness.core.content_key import digest, file_digests, record_digest
from harness.core.provenance import git_commit

from ..gpu_model import emulation_facts
from .checks import CSV_COLUMNS, STATUSES, BadInput, Row

KEY_FILE = "key.json"
ROWS_FILE = "ptx.csv"
KEY_FORMAT = 1
KEY_VERSIONS = ("triton", "fla-core", "torch")
"""The installed distributions whose versions are in the key: triton writes the PTX and records the
specializations, fla-core is the kernels, torch runs fla's Python around them (shapes, dtypes, autotune keys)."""



EMULATION = Path(__file__).resolve().parents[1]
"""``harness/emulation/``: the package whose modules are keyed (:func:`key_files`)."""


def key_files(package: Path = EMULATION) -> Dict[str, str]:
    """{path: sha256} of every module of ``harness/emulation/`` (this package with it): the checks, the emulation
    whose facts they hold the PTX to, and the capture's interpreter fixes. The GPU leg and the op bindings the
    capture runs are the leg's own inputs (``leg_inputs`` of :func:`content_key`)."""
    return file_digests(package.rglob("*.py"))


def key_versions() -> Dict[str, Optional[str]]:
    """The versions of :data:`KEY_VERSIONS` (None where one is not installed) and Python's major.minor."""
    import importlib.metadata

    out: Dict[str, Optional[str]] = {}
    for name in KEY_VERSIONS:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    out["python"] = f"{sys.version_info.major}.{sys.version_info.minor}"
    return out


def selection_argv(suite: str, case_ids: Sequence[str]) -> List[str]:
    """The ``parity run`` arguments that select the cases: ``--case`` each id, else ``--suite``."""
    return [a for c in case_ids for a in ("--case", c)] or ["--suite", suite]


def content_key(selection_argv: Sequence[str], targets: Sequence[str], *, leg_inputs: dict,
                facts: Optional[dict] = None) -> dict:
    """``{"key": sha256, "inputs": {...}}``: everything a sweep's rows are a function of, and its sha256.

    - ``targets``: what the kernels are compiled for;
    - ``selection`` as given, and ``leg_inputs``: what the captured leg's launches are a function of, as the
      baseline cache keys that leg's outputs (``harness.run.baseline_cache.leg_inputs``, handed in by the command
      line: this layer knows no leg): the leg, the ids of the cases selected (a suite's cases can change under its
      name), its environment (fla's, triton's and torch's versions, its settings), its sources and each op's
      binding;
    - ``versions`` (:func:`key_versions`): the compiler, the kernels and the framework around them;
    - ``files`` (:func:`key_files`): the checks and the emulation;
    - ``facts``: :func:`emulation_facts` probed live (``facts`` when the caller has them), the expectations.

    The launches file is not an input: the launches are a function of the inputs above, so a record made with
    ``--launches`` keys as one that captured them."""
    inputs = {
        "format": KEY_FORMAT,
        "targets": list(targets),
        "selection": list(selection_argv),
        **leg_inputs,
        "versions": key_versions(),
        "files": key_files(),
        "facts": dict(emulation_facts().as_dict() if facts is None else facts),
    }
    return {"key": record_digest(inputs), "inputs": inputs}


def input_differences(old: dict, new: dict) -> List[str]:
    """What differs between two keys' inputs, one name each: the targets, leg, selection and cases, each version,
    each fact, then each file changed, added or removed (files last: an edit moves many at once)."""
    out = []
    for name in ("format", "targets", "leg", "selection"):
        if old.get(name) != new.get(name):
            out.append(f"{name} {_brief(old.get(name))} -> {_brief(new.get(name))}")
    oc, nc = old.get("cases") or [], new.get("cases") or []
    if oc != nc:
        added, removed = len(set(nc) - set(oc)), len(set(oc) - set(nc))
        out.append(f"cases (+{added} -{removed})" if added or removed else "cases (order)")
    for group, label in (("versions", ""), ("facts", "fact "), ("environment", "leg environment "),
                         ("bindings", "binding of ")):
        o, n = old.get(group) or {}, new.get(group) or {}
        for name in sorted(set(o) | set(n)):
            if o.get(name) != n.get(name):
                out.append(f"{label}{name} {_brief(o.get(name))} -> {_brief(n.get(name))}" if group != "bindings"
                           else f"{label}{name} (changed)")
    if old.get("sources") != new.get("sources"):
        out.append(f"the {new.get('leg')} leg's sources (changed)")
    of, nf = old.get("files") or {}, new.get("files") or {}
    for path in sorted(set(of) | set(nf)):
        if of.get(path) != nf.get(path):
            out.append(f"{path} ({'added' if path not in of else 'removed' if path not in nf else 'changed'})")
    known = {"format", "targets", "leg", "selection", "cases", "versions", "facts", "files", "environment",
             "bindings", "sources"}
    out += [name for name in sorted((set(old) | set(new)) - known) if old.get(name) != new.get(name)]
    return out


def _brief(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def _names(items: Sequence[str], n: int = 5) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


@dataclasses.dataclass(frozen=True)
class Record:
    """A record of an earlier sweep, as ``--reuse`` reads it: its key.json and its rows (ptx.csv or ptx.csv.gz;
    ``text``: the plain CSV, whose sha256 key.json's ``rows_sha256`` names)."""

    directory: Path
    meta: dict
    rows_path: Path
    text: bytes
    rows: List[Row]


def read_record(directory: Path) -> Record:
    """The record in ``directory``; BadInput (one line, naming the file) when it or its key.json or rows are missing
    or unreadable. A key that differs is not an error here: :func:`reuse_verdict` says so, and the sweep runs."""
    directory = Path(directory)
    if not directory.is_dir():
        raise BadInput(f"--reuse: no such directory {directory}")
    key_path = directory / KEY_FILE
    try:
        meta = json.loads(key_path.read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"--reuse: cannot read {key_path}: {type(exc).__name__}: "
                       f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("key"), str) or not isinstance(meta.get("inputs"), dict):
        raise BadInput(f"--reuse: {key_path} is not a record's key.json (no key and inputs)")
    rows_path = next((p for p in (directory / ROWS_FILE, directory / (ROWS_FILE + ".gz")) if p.is_file()), None)
    if rows_path is None:
        raise BadInput(f"--reuse: no {ROWS_FILE} or {ROWS_FILE}.gz in {directory}")
    try:
        text = rows_path.read_bytes()
        if rows_path.suffix == ".gz":
            import gzip

            text = gzip.decompress(text)
        table = list(csv.reader(text.decode().splitlines()))
    except (OSError, ValueError, EOFError) as exc:
        raise BadInput(f"--reuse: cannot read {rows_path}: {type(exc).__name__}: "
                       f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    if not table or tuple(table[0]) != CSV_COLUMNS or any(len(r) != len(CSV_COLUMNS) or r[5] not in STATUSES
                                                          for r in table[1:]):
        raise BadInput(f"--reuse: {rows_path} is not a ptx.csv (columns {', '.join(CSV_COLUMNS)}; statuses "
                       f"{', '.join(STATUSES)})")
    return Record(directory, meta, rows_path, text, [Row(*r) for r in table[1:]])


def reuse_verdict(record: Record, current: dict) -> Optional[str]:
    """None when ``record`` verifies this sweep: made from the very inputs of ``current`` (:func:`content_key`),
    with rows that are all clean (no ``mismatch``, no ``error``: a failure is always reproduced for real) and
    unedited since (their sha256 is key.json's ``rows_sha256``). Otherwise why not, in a few words."""
    meta = record.meta
    if meta["key"] != current["key"]:
        diff = input_differences(meta["inputs"], current["inputs"])
        return (f"it was made from other inputs: {_names(diff)}" if diff else
                f"its key {meta['key'][:12]} is not the sha256 of its own inputs")
    if meta.get("rows_sha256") != digest(record.text):
        return (f"its rows {record.rows_path.name} were changed after it was recorded (not the rows_sha256 of "
                f"{KEY_FILE})")
    bad = Counter(r.status for r in record.rows if r.status in ("mismatch", "error"))
    if bad:
        return f"its rows have {bad['mismatch']} mismatch and {bad['error']} error rows (never reused)"
    if not record.rows:
        return "it has no rows"
    if meta.get("capture_rc", 0):
        return f"its capture's GPU-leg run exited {meta['capture_rc']}"
    return None


def copy_record(record: Record, out: Path) -> None:
    """The record's files into ``out`` (its rows as plain ptx.csv); nothing to do when ``out`` is the record."""
    import shutil

    if out.resolve() == record.directory.resolve():
        return
    for src in sorted(record.directory.iterdir()):
        if src.is_file() and src.name != ROWS_FILE + ".gz" and src != record.rows_path:
            shutil.copyfile(src, out / src.name)
    (out / ROWS_FILE).write_bytes(record.text)



def row_counts(rows: Sequence[Row], targets: Sequence[str]) -> dict:
    st = Counter(r.status for r in rows)
    return {"kernels": {t: len({r.kernel for r in rows if r.target == t}) for t in targets},
            "checks": st["match"] + st["mismatch"], **{s: st[s] for s in STATUSES}}


def write_key(out: Path, current: dict, rows: Sequence[Row], targets: Sequence[str], **provenance) -> dict:
    """key.json beside ``out``'s ptx.csv: the content key (:func:`content_key`), the commit it was made at, the
    rows' counts and their sha256 (so rows edited afterwards are never served), and ``provenance`` (where the
    launches came from, the capture's exit status): said, not keyed."""
    record = {**current, "made_at": git_commit(short=False), "made_on": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "summary": row_counts(rows, targets), "rows_sha256": digest((out / ROWS_FILE).read_bytes()),
              **provenance}
    (out / KEY_FILE).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


def launches_selection(data: dict) -> Optional[tuple]:
    """(leg, selection argv) a launches file was captured for (as the sweep keyed them, else as read from the
    ``parity run`` arguments it records), or None (not recorded)."""
    if isinstance(data.get("leg"), str) and isinstance(data.get("selection"), list):
        return data["leg"], data["selection"]
    argv = data.get("parity_argv")
    if not isinstance(argv, list):
        return None
    leg = next((argv[i + 1] for i in range(len(argv) - 1) if argv[i] == "--backend"), None)
    sel = [a for i in range(len(argv) - 1) if argv[i] in ("--suite", "--case") for a in (argv[i], argv[i + 1])]
    return leg, sel


def record_command(argv: Sequence[str], targets: Sequence[str], out) -> str:
    import shlex

    return " ".join(["parity ptx", *map(shlex.quote, argv), "--target", ",".join(targets), "--out",
                     shlex.quote(str(out))])

