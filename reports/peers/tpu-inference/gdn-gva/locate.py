"""Where fused_gdn's decode error sits, and whether the MXU model makes it: the final state's rel_l2 per request
against the float64 reference, with every dot rounded as the MXU does (the candidate leg's default) and with the
dots left exact (XLA:CPU's f32), on one decode case and draw. Prints a table; README.md quotes it.

    python reports/peers/tpu-inference/gdn-gva/locate.py [CASE_ID [SEED]]
"""

import contextlib
import sys

import numpy as np

from harness.app import case_from_id
from harness.app.analysis import golden, rel_l2 as rel, run_case
from harness.legs import external

CASE = ("gdn.fused_recurrent/B1-T27-H2-HV4-K128-V128/bf16/g=logsigmoid/16/C64/lens=1+1+1+9+15,h0,"
        "use_beta_sigmoid_in_kernel=1,use_gate_in_kernel=1,use_qk_l2norm_in_kernel=1")


def main(case_id=CASE, seed=0):
    g = golden(case_from_id(case_id).replace(seed=int(seed)))
    case, gold = g.case, g.tensors
    rows = {}
    for label, model in (("MXU model", external.mxu_rounding), ("exact f32 dots", contextlib.nullcontext)):
        external.mxu_rounding = model
        out = run_case(g, "tpu-inference").tensors
        rows[label] = (rel(out["ht"], gold["ht"], (1, 2, 3)), rel(out["o"], gold["o"], (0, 2, 3)))
    lens = case.lens
    print(f"{case.id} seed {case.seed}\nrequest lengths {lens}")
    for label, (ht, o) in rows.items():
        print(f"{label:15s} ht rel_l2 per request: " + " ".join(f"{v:.2e}" for v in ht))
        print(f"{label:15s} o  rel_l2 per token  : median {np.median(o):.2e}, max {o.max():.2e}")


if __name__ == "__main__":
    main(*sys.argv[1:])
