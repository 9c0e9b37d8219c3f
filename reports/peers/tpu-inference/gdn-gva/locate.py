"""Where fused_gdn's decode error sits, and whether the MXU model makes it: the final state's rel_l2 per request
against the float64 reference, with every dot rounded as the MXU does (the candidate leg's default) and with the
dots left exact (XLA:CPU's f32), on one decode case and draw. Prints a table; README.md quotes it.

    python reports/peers/tpu-inference/gdn-gva/locate.py [CASE_ID [SEED]]
"""

import contextlib
import sys

import numpy as np

from cases.inputs import make_inputs
from harness.app import case_from_id
from harness.legs import external
from harness.legs.registry import make_leg
from harness.ops import get_op
from harness.run.reference_cache import ReferenceCache

CASE = ("gdn.fused_recurrent/B1-T27-H2-HV4-K128-V128/bf16/g=logsigmoid/16/C64/lens=1+1+1+9+15,h0,"
        "use_beta_sigmoid_in_kernel=1,use_gate_in_kernel=1,use_qk_l2norm_in_kernel=1")


def rel(a, b, axis):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.sqrt(((a - b) ** 2).sum(axis) / (b ** 2).sum(axis))


def main(case_id=CASE, seed=0):
    case = case_from_id(case_id).replace(seed=int(seed))
    op = get_op(case.op)
    x = make_inputs(case, op.inputs(case))
    gold = ReferenceCache(None).get(op, case, x)
    rows = {}
    for label, model in (("MXU model", external.mxu_rounding), ("exact f32 dots", contextlib.nullcontext)):
        external.mxu_rounding = model
        leg = make_leg("tpu-inference", compile_targets=())
        out = leg.run(op, case, x).tensors
        rows[label] = (rel(out["ht"], gold["ht"], (1, 2, 3)), rel(out["o"], gold["o"], (0, 2, 3)))
    lens = case.lens
    print(f"{case.id} seed {case.seed}\nrequest lengths {lens}")
    for label, (ht, o) in rows.items():
        print(f"{label:15s} ht rel_l2 per request: " + " ".join(f"{v:.2e}" for v in ht))
        print(f"{label:15s} o  rel_l2 per token  : median {np.median(o):.2e}, max {o.max():.2e}")


if __name__ == "__main__":
    main(*sys.argv[1:])
