"""Where a case's dg error sits, per leg: ``python where_dg.py CASE_ID`` (repository root, venv active)."""
import sys, numpy as np
from harness.app import case_from_id
from harness.ops import get_op
from cases.inputs import make_inputs
from harness.legs import make_leg
from harness.run.reference_cache import ReferenceCache
case = case_from_id(sys.argv[1]); op = get_op(case.op); x = make_inputs(case, op.inputs(case))
ref = np.asarray(ReferenceCache(None).get(op, case, x)["dg"], np.float64)
for name in ("gpu", "tpu"):
    t = make_leg(name, **({"compile_targets": ()} if name == "tpu" else {})).run(op, case, x).tensors
    e = np.abs(np.asarray(t["dg"], np.float64) - ref)
    i = np.unravel_index(e.argmax(), e.shape)
    top = np.argsort(e.ravel())[-5:][::-1]
    print(name, "max", e.max(), "at", i, "ref", ref[i], "|ref| max", np.abs(ref).max(), "rel_l2", np.linalg.norm(e)/np.linalg.norm(ref),
          "top5 t", [int(np.unravel_index(k, e.shape)[1]) for k in top], "p99 err", np.quantile(e, 0.99))
