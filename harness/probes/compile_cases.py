"""``parity compile``'s work: each case through a candidate leg's own runner steps, then compiled ahead of
time for real TPU targets (:mod:`harness.compile.tpu_compile`), one row per (case, target)."""

from __future__ import annotations

from pathlib import Path

from harness.core.content_key import files_digest
from harness.run.baseline_cache import BaselineCache, cached, source_closure
from harness.legs.registry import default_leg
from harness.legs.tpu import NATIVE, device_arrays, program
from harness.run.runner import Refusal, Runner, impl_option
from harness.core.status import Status
from harness.compile.tpu_compile import MEMORY_FIELDS, TARGETS, compile_for, versions
from harness.core.schema import COMPILE_COLUMNS, COMPILE_MODE  # noqa: F401  (COMPILE_COLUMNS: read here by its callers)



_ROOT = Path(__file__).resolve().parents[2]  # the repository: harness/<stage>/<module>.py


def compile_sources() -> list[Path]:
    """The files a compile row depends on besides the candidate leg's own cache key (:class:`ContentKeys`): the
    compile and the reading of Mosaic's dump (with the MXU model) transitively, the TPU leg's program, this
    module, and the runner's steps up to the run (validation, inputs, supports) as one file each."""
    closure = source_closure([_ROOT / "harness/compile/tpu_compile.py", _ROOT / "harness/legs/tpu.py"])
    return sorted(closure | {_ROOT / "harness/probes/compile_cases.py", _ROOT / "harness/run/runner.py", _ROOT / "cases/inputs.py"})


class ContentKeys:
    """The content key of a compile row: sha256 of everything the row was made from, so that a committed
    ``compile.csv`` can stand for a compile that would give the same row (``parity compile --reuse``).

    It is the candidate cache's key (:meth:`harness.run.baseline_cache.BaselineCache.content_key`: the leg's
    environment, with jax's, jaxlib's and libtpu's versions, its sources and every module the op's binding
    imports from this repository, transitively; the case id), plus the target and :func:`compile_sources`. An
    edit to ``kernels_tpu/kda/`` moves kda's and gdn's keys and no other op's; a new libtpu moves every key. A leg
    whose outputs are never cached (an external candidate: no sources here to hash) has no key: its rows are
    always compiled."""

    def __init__(self, leg):
        self.cache = BaselineCache(leg, directory=None) if cached(leg.name) else None
        self.sources = files_digest(compile_sources()) if self.cache is not None else ""

    def __call__(self, op, case, target: str) -> str | None:
        if self.cache is None:
            return None
        return self.cache.content_key(op, case, task="compile", target=target, compile_sources=self.sources)


def case_rows(case, targets: tuple[str, ...], runner: Runner) -> list[dict]:
    """One row per target for one case: ``ok``, ``error`` or ``unsupported`` (with its reason).

    The case goes through the candidate leg's own runner steps (validation, inputs, supports) first:
    ``runner`` is a ``Runner`` over a ``TpuLeg`` built with no compile targets of its own, or over any
    candidate leg (an external implementation's binding compiles the same way).
    """
    leg = runner.leg
    base = _base(case, targets, runner)
    try:
        op, inputs = runner.prepare(case)
    except Refusal as r:
        return [{**base, "target": t, "topology": TARGETS[t], "status": r.status, "reason": r.reason,
                 "input_sha256": r.columns.get("input_sha256")} for t in targets]
    keys = _content_keys(runner)
    base["input_sha256"] = inputs.sha256
    binding = leg.binding(op)
    if not binding.differentiable:
        base["program"] = f"forward (the {leg.name} binding is forward-only)"
    fn, arrays = program(op, case, NATIVE, binding=binding), device_arrays(inputs)
    out = []
    for target in targets:
        r = leg.compile_for(compile_for, fn, arrays, target)
        out.append({**base, "target": target, "topology": TARGETS[target], "status": r.status, "reason": r.reason,
                    "compile_s": r.seconds, "error": "" if r.ok else r.error, **r.kernel_columns,
                    **(r.memory or {}), "hbm_bytes": r.hbm_bytes, "content_key": keys(op, case, target)})
    return out


_KEYS: dict[int, tuple[object, ContentKeys]] = {}


def _content_keys(runner) -> ContentKeys:
    """The :class:`ContentKeys` of the runner's leg, made once per leg object (it hashes the compile's sources;
    the leg is kept alive here, so its id is not reused)."""
    if id(runner.leg) not in _KEYS:
        _KEYS[id(runner.leg)] = (runner.leg, ContentKeys(runner.leg))
    return _KEYS[id(runner.leg)][1]


class RecordError(ValueError):
    """A ``--reuse`` file that cannot be used (missing, unreadable, not compile rows with content keys)."""


def read_record(paths) -> dict[str, dict]:
    """The reusable rows of earlier compiles (``compile.csv`` files, gzipped or not), by content key: the ``ok``
    rows. An ``error`` or ``unsupported`` row is never reused: a failure is always reproduced for real."""
    import pandas as pd

    record: dict[str, dict] = {}
    for path in paths:
        try:
            df = pd.read_csv(path)
        except FileNotFoundError:
            raise RecordError(f"--reuse: no such file {path}") from None
        except Exception as exc:  # noqa: BLE001 - any unreadable file is the user's input
            raise RecordError(f"--reuse: cannot read {path}: {' '.join(str(exc).split())[:200]}") from None
        missing = sorted({"case_id", "target", "status", "content_key"} - set(df.columns))
        if missing:
            raise RecordError(f"--reuse: {path} is not compile rows with content keys (no {', '.join(missing)}); "
                              "make it with parity compile")
        ok = df[(df["status"] == Status.OK) & df["content_key"].notna()]
        for row in ok.astype(object).where(ok.notna(), None).to_dict("records"):
            record[row["content_key"]] = {**row, "reused_from": row.get("reused_from") or str(path)}
    return record


def reused_rows(case, targets: tuple[str, ...], runner, record: dict[str, dict]) -> list[dict] | None:
    """The case's rows from ``record`` when the row of every target has the content key this compile would
    have, else None (compile it)."""
    if not record:
        return None
    try:
        op = runner.op_of(case)
    except Exception:  # noqa: BLE001 - an unknown op is settled by the compile, as an error row
        return None
    keys = _content_keys(runner)
    rows = [record.get(keys(op, case, target) or "") for target in targets]
    return None if any(r is None for r in rows) else rows


def _base(case, targets: tuple[str, ...], runner) -> dict:
    """The columns every row of the case shares."""
    leg = runner.leg.name
    backend = "" if leg == default_leg("candidate") else f" --backend {leg}{impl_option(leg)}"
    return {"case_id": case.id, "op": case.op, "variant": case.variant, "dtype": case.dtype, "mode": COMPILE_MODE,
            "program": f"forward + backward (jax.vjp of the {leg} binding)", **versions(),
            "git_commit": runner.provenance["git_commit"],
            "repro": f"parity compile{backend} --case '{case.id}' --target {','.join(targets)}"}


def error_rows(case, targets: tuple[str, ...], runner, reason: str) -> list[dict]:
    """One ``error`` row per target for a case that could not be compiled at all (its worker died)."""
    return [{**_base(case, targets, runner), "target": t, "topology": TARGETS[t], "status": Status.ERROR,
             "reason": reason, "error": reason} for t in targets]


def compile_frame(rows: list[dict]):
    """The rows as ``compile.csv`` holds them; a compiled row is stamped now, a reused one keeps its time."""
    import datetime as _dt

    import pandas as pd

    df = pd.DataFrame(rows)
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    if "reused_from" in df and "timestamp" in df:
        df["timestamp"] = df["timestamp"].where(df["reused_from"].notna(), now)
    else:
        df["timestamp"] = now
    for col in COMPILE_COLUMNS:
        if col not in df.columns:
            df[col] = pd.NA
    return df[COMPILE_COLUMNS]
