"""Where the decode kernels' largest ht error sits: per draw, the element of the largest |ht - float64| for fla and for
this project's kernel, and each packed sequence's largest error (README.md quotes its output).

    python reports/calibration/decode-recurrent/locate_max.py CASE_ID SEED [SEED ...]
"""

import sys, numpy as np
from harness.app.analysis import f64, golden, run_case
base = sys.argv[1]
for s in sys.argv[2:]:
    cid = base.replace("/lens=", "/lens=") if s == "0" else base.replace(",h0,", f",h0,seed={s},")
    g = golden(cid)
    gold = f64(g.tensors["ht"])
    fla, tpu = (f64(run_case(g, leg).tensors["ht"]) for leg in ("gpu", "tpu"))
    out = [f"seed {s}"]
    for name, a in (("fla", fla), ("tpu", tpu)):
        e = np.abs(a - gold); i = np.unravel_index(np.argmax(e), e.shape)
        per = e.reshape(e.shape[0], -1).max(1)
        out.append(f"{name}: max {e.max():.3e} at {i} |gold| {abs(gold[i]):.3f}; per seq " + " ".join(f"{p:.2e}" for p in per))
    print(" | ".join(out), flush=True)
