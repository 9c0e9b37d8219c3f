"""Where a case's dg error sits, per leg: ``python where_dg.py CASE_ID`` (repository root, venv active)."""
import sys, numpy as np
from harness.app.analysis import f64, golden, run_case
g = golden(sys.argv[1])
ref = f64(g.tensors["dg"])
for name in ("gpu", "tpu"):
    e = np.abs(run_case(g, name).error("dg"))
    i = np.unravel_index(e.argmax(), e.shape)
    top = np.argsort(e.ravel())[-5:][::-1]
    print(name, "max", e.max(), "at", i, "ref", ref[i], "|ref| max", np.abs(ref).max(), "rel_l2", np.linalg.norm(e)/np.linalg.norm(ref),
          "top5 t", [int(np.unravel_index(k, e.shape)[1]) for k in top], "p99 err", np.quantile(e, 0.99))
