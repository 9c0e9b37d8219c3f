"""The batched grid interpreter against jax's per-program interpret mode, row by row, on whole suites.

For every case of the selection that the leg takes, runs the leg twice in one process on the case's draw-0
inputs, both under the leg's compiler options: with every interpret-mode pallas_call by
:mod:`harness.emulation.pallas_batched` (its context's ``batched_grid``), and by jax's own per-program TPU interpret mode. Writes one CSV row per case: the
tensors compared, those that are not bit for bit equal (NaN positions and signs included) or whose MXU tally
columns differ, how each kernel's grid ran, and both wall times (first run in the process: compiles included).
Exit 1 when any tensor differs.

    .venv/bin/python benchmarks/pallas_grid_rows.py --leg tpu --suite smoke,regressions --out reports/.../tpu.csv
    .venv/bin/python benchmarks/pallas_grid_rows.py --leg tpu-inference --suite smoke,regressions --op gdn --out ...

Works for any leg built on the TPU leg (this project's kernels, and every outside candidate in its interpret mode).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v6e-4")
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")

import numpy as np  # noqa: E402


def _bits(x):
    x = np.asarray(x)
    return x.shape, x.dtype.str, x.tobytes()


def _columns(out) -> dict:
    """The row's MXU tally columns, NaN (a case without MXU dots: mxu_cost 0/0) compared as equal to itself."""
    return {k: ("nan" if isinstance(v, float) and np.isnan(v) else v) for k, v in out.columns.items()}


def with_grid(leg, batched: bool):
    """The same leg object under the leg's compiler options (:func:`harness.legs.tpu.interpret_options`),
    its pallas_calls by the batched grid interpreter or by jax's per-program interpret mode."""
    from harness.legs.tpu import interpret_options

    context = type(leg).context
    leg.context = lambda: dataclasses.replace(context(leg), batched_grid=batched,
                                              compiler_options=interpret_options())
    return leg


def _one_line(exc) -> str:
    return "" if exc is None else f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"


def _run(leg, op, case, inputs):
    """``(output, None)``, or ``(None, the exception)`` when the run raises: a row either way, never a crash."""
    try:
        return leg.run(op, case, inputs), None
    except Exception as exc:  # noqa: BLE001 - the leg's failure is a result here
        return None, exc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--leg", default="tpu")
    p.add_argument("--suite", default="smoke,regressions")
    p.add_argument("--cases", type=Path, help="these cases instead of --suite: a TOML cases file or one id per line")
    p.add_argument("--op", default=None, help="keep only these ops (comma-separated)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()

    import pandas as pd

    from cases.inputs import make_inputs
    from cases.suites import get_suite
    from harness.app.selection import case_from_id, load_cases
    from harness.legs.registry import leg_spec
    from harness.ops import get_op

    spec = leg_spec(args.leg)
    batched = with_grid(spec.build(force_interpret=True, compile_targets=()), True)
    plain = with_grid(spec.build(force_interpret=True, compile_targets=()), False)
    if args.cases is None:
        cases = list(dict.fromkeys(c for s in args.suite.split(",") for c in get_suite(s)))
    elif args.cases.suffix == ".toml":
        cases = load_cases(args.cases)
    else:
        cases = [case_from_id(line.strip()) for line in args.cases.read_text().splitlines() if line.strip()]
    if args.op:
        cases = [c for c in cases if c.op in args.op.split(",")]
    rows = []
    for i, case in enumerate(cases):
        op = get_op(case.op)
        inputs = make_inputs(case, op.inputs(case))
        row = dict(case=case.id, mode="emulated (Pallas TPU interpret mode on the CPU)", input_sha256=inputs.sha256)
        try:
            refusal = batched.supports(op, case)
        except Exception as exc:  # noqa: BLE001 - the implementation fails while the leg asks what it takes
            rows.append({**row, "error": f"supports: {_one_line(exc)}"})  # as a run makes it an error row
            print(f"[{i + 1}/{len(cases)}] ERROR (both modes: the leg's supports) {case.id}", flush=True)
            continue
        if refusal:
            continue
        t0 = time.perf_counter()
        a, error_a = _run(plain, op, case, inputs)
        t1 = time.perf_counter()
        b, error_b = _run(batched, op, case, inputs)
        t2 = time.perf_counter()
        if isinstance(error_a, NotImplementedError) and isinstance(error_b, NotImplementedError):
            continue  # the kernels refuse the case while tracing, in both modes
        if error_a is not None or error_b is not None:
            same = type(error_a) is type(error_b) and _one_line(error_a) == _one_line(error_b)
            row.update(error=f"per program: {_one_line(error_a)} | batched: {_one_line(error_b)}",
                       differ="" if same else "raised in one mode only, or differently")
            rows.append(row)
            print(f"[{i + 1}/{len(cases)}] ERROR ({'the same in both modes' if same else 'DIFFERS'}) {case.id}",
                  flush=True)
            continue
        names = sorted(n for n in a.tensors if a.tensors[n] is not None)
        differ = [n for n in names if b.tensors.get(n) is None or _bits(a.tensors[n]) != _bits(b.tensors[n])]
        columns_a, columns_b = _columns(a), _columns(b)
        if columns_a != columns_b:
            differ.append("mxu columns: " + ", ".join(f"{k} {columns_a.get(k)} -> {columns_b.get(k)}"
                                                      for k in sorted(set(columns_a) | set(columns_b))
                                                      if columns_a.get(k) != columns_b.get(k)))
        row.update(tensors=len(names), differ=";".join(differ), per_program_s=round(t1 - t0, 2),
                   batched_s=round(t2 - t1, 2), grids=" | ".join(b.details.get("pallas_grid", [])))
        rows.append(row)
        print(f"[{i + 1}/{len(cases)}] {'SAME' if not differ else 'DIFFERS ' + str(differ)} "
              f"{row['per_program_s']:6.1f}s -> {row['batched_s']:6.1f}s {case.id}", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_csv(args.out, index=False)
    table = pd.DataFrame(rows)
    if table.empty:
        print(f"the {args.leg} leg takes none of these cases")
        return 2
    n_diff = int(table["differ"].fillna("").astype(bool).sum())
    n_error = int(table["error"].notna().sum()) if "error" in table else 0
    print(f"{len(table)} cases ({n_error} raised), {int(table['tensors'].fillna(0).sum())} tensors: {n_diff} cases differ; "
          f"per program {table['per_program_s'].sum():.0f} s, batched {table['batched_s'].sum():.0f} s")
    return int(n_diff > 0)


if __name__ == "__main__":
    sys.exit(main())
