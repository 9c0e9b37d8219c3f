"""``parity compile``'s work: each case through a candidate leg's own runner steps, then compiled ahead of
time for real TPU targets (:mod:`harness.tpu_compile`), one row per (case, target)."""

from __future__ import annotations

from .legs.registry import default_leg, make_leg
from .legs.tpu import NATIVE, device_arrays, program
from .reference_cache import ReferenceCache
from .runner import Refusal, Runner
from .status import Status
from .mosaic_dump import MOSAIC_COLUMNS
from .tpu_compile import COMPILE_MODE, KERNEL_COLUMNS, MEMORY_FIELDS, TARGETS, compile_for, versions


COMPILE_COLUMNS = [
    "case_id", "op", "variant", "dtype", "target", "topology", "mode", "status", "reason", "compile_s", "error",
    *KERNEL_COLUMNS, *MOSAIC_COLUMNS, *MEMORY_FIELDS, "hbm_bytes", "program", "jax", "jaxlib", "libtpu", "input_sha256", "git_commit",
    "timestamp", "repro",
]


def case_rows(case, targets: tuple[str, ...], ops=None, runner=None) -> list[dict]:
    """One row per target for one case: ``ok``, ``error`` or ``unsupported`` (with its reason).

    The case goes through the TPU leg's own runner steps (validation, inputs, supports) first;
    ``runner`` (a ``Runner`` over a ``TpuLeg``, or over any candidate leg: an external implementation's
    binding compiles the same way) is built when not given.
    """
    runner = runner or Runner(make_leg(default_leg("candidate"), compile_targets=()), ReferenceCache(None), ops=ops)
    leg = runner.leg
    base = _base(case, targets, runner)
    try:
        op, inputs = runner.prepare(case)
    except Refusal as r:
        return [{**base, "target": t, "topology": TARGETS[t], "status": r.status, "reason": r.reason,
                 "input_sha256": r.columns.get("input_sha256")} for t in targets]
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
                    **(r.memory or {}), "hbm_bytes": r.hbm_bytes})
    return out


def _base(case, targets: tuple[str, ...], runner) -> dict:
    """The columns every row of the case shares."""
    leg = runner.leg.name
    backend = "" if leg == default_leg("candidate") else f" --backend {leg}"
    return {"case_id": case.id, "op": case.op, "variant": case.variant, "dtype": case.dtype, "mode": COMPILE_MODE,
            "program": f"forward + backward (jax.vjp of the {leg} binding)", **versions(),
            "git_commit": runner.provenance["git_commit"],
            "repro": f"parity compile{backend} --case '{case.id}' --target {','.join(targets)}"}


def error_rows(case, targets: tuple[str, ...], runner, reason: str) -> list[dict]:
    """One ``error`` row per target for a case that could not be compiled at all (its worker died)."""
    return [{**_base(case, targets, runner), "target": t, "topology": TARGETS[t], "status": Status.ERROR,
             "reason": reason, "error": reason} for t in targets]


def compile_frame(rows: list[dict]):
    import datetime as _dt

    import pandas as pd

    df = pd.DataFrame(rows)
    df["timestamp"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    for col in COMPILE_COLUMNS:
        if col not in df.columns:
            df[col] = pd.NA
    return df[COMPILE_COLUMNS]
