"""Where a case's ht error sits, per leg: ``python where.py CASE_ID`` (from the repository root, venv active).

Runs the GPU leg (emulated fla) and the TPU leg (interpret mode, no real-TPU compile) on the case's inputs, and
prints each leg's largest |ht - reference| with its index, per sequence and per head, beside |h0| and |ht|.
"""
import sys, numpy as np
from harness.app.analysis import golden, run_case
g = golden(sys.argv[1])
case, x, ref = g.case, g.inputs, g.tensors
outs = {name: run_case(g, name).tensors for name in ("gpu", "tpu")}
r = np.asarray(ref["ht"], np.float64)
print("ht shape", r.shape, "cu", case.cu_seqlens)
for name, t in outs.items():
    e = np.abs(np.asarray(t["ht"], np.float64) - r)
    per_seq = e.reshape(e.shape[0], -1).max(axis=1)
    idx = np.unravel_index(e.argmax(), e.shape)
    print(name, "max", e.max(), "at", idx, "ref there", r[idx], "per-seq max", per_seq, "per-head", e.max(axis=(2,3)).max(axis=0))
h0 = np.asarray(x.arrays["h0"], np.float64)
print("|h0| max per seq", np.abs(h0).reshape(h0.shape[0], -1).max(axis=1), "|ht| max", np.abs(r).reshape(r.shape[0], -1).max(axis=1))
