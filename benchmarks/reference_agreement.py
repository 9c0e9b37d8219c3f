"""Two checkouts' float64 references on the same cases, tensor by tensor: does a change to references/ move them?

``--dump DIR`` computes, from the checkout this script runs in, every case's reference outputs with both
formulations (``method="chunk"``, the golden, and ``method="recurrent"``, the reference leg's check, where the
reference leg takes it) on the case's draw-0 inputs, one ``.npz`` per case and method. ``--compare OLD NEW``
then reports, per case, method and tensor, ``max|new - old| / max|old|`` and the largest over everything, and
fails (exit 1) when one exceeds ``--tol`` (default 1e-12) or a tensor is missing on one side.

    git worktree add /tmp/old HEAD~1
    (cd /tmp/old && python benchmarks/reference_agreement.py --dump /tmp/ref-old --suite smoke,regressions)
    python benchmarks/reference_agreement.py --dump /tmp/ref-new --suite smoke,regressions
    python benchmarks/reference_agreement.py --compare /tmp/ref-old /tmp/ref-new --out reports/.../agreement.csv
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _name(case_id: str, method: str) -> str:
    return f"{hashlib.sha256(case_id.encode()).hexdigest()[:24]}.{method}.npz"


def dump(out: Path, suites: str) -> None:
    from cases.inputs import make_inputs
    from cases.suites import get_suite
    from harness.legs.ref import RefLeg
    from harness.ops import get_op
    from harness.ops.base import call_k_first
    from harness.run.runner import drop_compiles_if_crowded

    out.mkdir(parents=True, exist_ok=True)
    cases = [c for s in suites.split(",") for c in get_suite(s)]
    for i, case in enumerate(dict.fromkeys(cases)):
        drop_compiles_if_crowded()  # as the runner does: every compiled program keeps its mappings
        op = get_op(case.op)
        inputs = make_inputs(case, op.inputs(case))
        for method in ("chunk", "recurrent"):
            path = out / _name(case.id, method)
            if path.exists():
                continue
            if method == "recurrent" and RefLeg("recurrent").supports(op, case):
                continue
            t0 = time.perf_counter()
            res = call_k_first(case, op.reference, inputs.as_float64(), method=method)
            arrays = {k: np.asarray(v) for k, v in res.items() if v is not None}
            np.savez(path, __case__=np.array(case.id), **arrays)
            print(f"[{i + 1}/{len(cases)}] {method:9s} {time.perf_counter() - t0:6.1f}s {case.id}", flush=True)


MODE = "native (float64 JAX reference on the CPU)"


def with_provenance(table):
    """``table`` with each row's execution mode and its case's draw-0 inputs' sha256 (``Inputs.sha256``, a
    function of the case id alone), after the ``case`` column."""
    from cases.inputs import make_inputs
    from harness.app.selection import case_from_id
    from harness.ops import get_op

    def sha(case_id):
        case = case_from_id(case_id)
        return make_inputs(case, get_op(case.op).inputs(case)).sha256

    hashes = {c: sha(c) for c in table["case"].unique()}
    table = table.drop(columns=[c for c in ("mode", "input_sha256") if c in table])
    table.insert(1, "mode", MODE)
    table.insert(2, "input_sha256", table["case"].map(hashes))
    return table


def compare(old: Path, new: Path, tol: float, out: Path | None) -> int:
    import pandas as pd

    rows = []
    for path in sorted(old.glob("*.npz")):
        method = path.name.split(".")[1]
        with np.load(path) as a:
            case = str(a["__case__"])
            olds = {k: a[k] for k in a.files if k != "__case__"}
        other = new / path.name
        if not other.exists():
            rows.append(dict(case=case, method=method, tensor="*", rel=np.inf, note="missing in new"))
            continue
        with np.load(other) as b:
            news = {k: b[k] for k in b.files if k != "__case__"}
        for name in sorted(set(olds) | set(news)):
            if name not in olds or name not in news:
                rows.append(dict(case=case, method=method, tensor=name, rel=np.inf, note="missing on one side"))
                continue
            x, y = olds[name], news[name]
            assert x.dtype == y.dtype == np.float64, (name, x.dtype, y.dtype)
            scale = np.max(np.abs(x)) if x.size else 0.0
            diff = np.max(np.abs(y - x)) if x.size else 0.0
            rel = 0.0 if diff == 0 else (diff / scale if scale > 0 else np.inf)
            rows.append(dict(case=case, method=method, tensor=name, rel=float(rel), note=""))
    table = with_provenance(pd.DataFrame(rows))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(out, index=False)
    worst = table.sort_values("rel", ascending=False).head(5)
    print(f"{len(table)} tensors over {table['case'].nunique()} cases; largest max|new-old|/max|old|: "
          f"{table['rel'].max():.3g} (tolerance {tol:g})")
    print(worst.to_string(index=False))
    return int(bool((table["rel"] > tol).any()))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dump", type=Path)
    p.add_argument("--suite", default="smoke,regressions")
    p.add_argument("--compare", nargs=2, type=Path, metavar=("OLD", "NEW"))
    p.add_argument("--tol", type=float, default=1e-12)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if args.dump:
        dump(args.dump, args.suite)
        return 0
    if args.compare:
        return compare(*args.compare, args.tol, args.out)
    p.error("give --dump DIR or --compare OLD NEW")


if __name__ == "__main__":
    sys.exit(main())
