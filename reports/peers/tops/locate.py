"""Where tops' failing tensors are wrong, on tops' own stack (jax 0.9.2): the candidate leg's outputs and
gradients against the float64 reference, per token, chunk and head, with every dot rounded as the MXU does (the
leg's default) and with the dots left exact (XLA:CPU's f32). README.md quotes its output.

    python reports/peers/tops/locate.py padded [CASE_ID]   # finding 1: ht / ht_true per head vs exp(g_gamma * pad)
    python reports/peers/tops/locate.py precision [CASE_ID] # finding 2: o's error per token, MXU model vs exact dots
    python reports/peers/tops/locate.py where CASE_ID TENSOR[,TENSOR..]  # per chunk, head, token; MXU vs exact
"""

import contextlib
import sys

import numpy as np

from harness.app.analysis import f64, golden, rel_l2 as rel, run_case
from harness.legs import external

PADDED = "simple_gla.chunk/B1-T100-H1-K128-V128/bf16/g_gamma=alibi(L32,l0)/C64/h0,dht"
FP16 = "simple_gla.chunk/B1-T128-H2-K128-V128/fp16/g_gamma=alibi(L32,l0)/C64/h0,dht"


def run(case_id, exact=False):
    g = golden(case_id)
    case, x, gold = g.case, g.inputs, g.tensors
    saved = external.mxu_rounding
    if exact:
        external.mxu_rounding = contextlib.nullcontext
    try:
        out = run_case(g, "tops").tensors
    finally:
        external.mxu_rounding = saved
    return case, x, gold, out


def padded(case_id=PADDED):
    case, x, gold, out = run(case_id)
    C = case.chunk_size
    pad = -case.T % C
    gamma = f64(x["g_gamma"]).reshape(-1)
    print(f"{case.id}\nT = {case.T}, C = {C}: tops pads {pad} zero tokens")
    for h in range(case.H):
        got, ref = f64(out["ht"])[:, h], f64(gold["ht"])[:, h]
        factor = (got * ref).sum() / (ref * ref).sum()
        print(f"head {h}: g_gamma {gamma[h]:.6f}; ht = {factor:.6f} x ht_true (least squares), "
              f"exp(g_gamma * {pad}) = {np.exp(gamma[h] * pad):.6f}; "
              f"rel_l2(ht, exp(g_gamma*{pad}) ht_true) = {rel(got, np.exp(gamma[h] * pad) * ref):.2e}")
    for name in ("o", "dq", "dk", "dv", "dh0"):
        if name in out and name in gold:
            per_token = rel(out[name], gold[name], (0, 2, 3)) if out[name].ndim == 4 and name != "dh0" else None
            text = f"{name}: rel_l2 {rel(out[name], gold[name]):.2e}"
            if per_token is not None:
                chunks = [float(rel(f64(out[name])[:, s:s + C], f64(gold[name])[:, s:s + C]))
                          for s in range(0, case.T, C)]
                text += (f"; per chunk " + " ".join(f"{c:.2e}" for c in chunks)
                         + f"; per token max {per_token.max():.2e} at t = {int(per_token.argmax())}")
            print(text)


def precision(case_id=FP16):
    for exact in (False, True):
        case, x, gold, out = run(case_id, exact)
        label = "exact f32 dots" if exact else "MXU model"
        per_token = rel(out["o"], gold["o"], (0, 2, 3))
        per_head = rel(out["o"], gold["o"], (0, 1, 3))
        C = case.chunk_size
        chunks = [float(rel(f64(out["o"])[:, s:s + C], f64(gold["o"])[:, s:s + C])) for s in range(0, case.T, C)]
        print(f"{label:15s} o rel_l2 {rel(out['o'], gold['o']):.2e}; per head " + " ".join(f"{v:.2e}" for v in per_head)
              + "; per chunk " + " ".join(f"{v:.2e}" for v in chunks)
              + f"; per token median {np.median(per_token):.2e}, min {per_token.min():.2e}, max {per_token.max():.2e}"
              + f"; ht rel_l2 {rel(out['ht'], gold['ht']):.2e}")


def where(case_id, tensors):
    for exact in (False, True):
        case, x, gold, out = run(case_id, exact)
        C = case.chunk_size
        for name in tensors.split(","):
            got, ref = f64(out[name]), f64(gold[name])
            text = f"{'exact f32 dots' if exact else 'MXU model':15s} {name}: rel_l2 {rel(got, ref):.2e}"
            if got.ndim == 4 and got.shape[1] == case.T:  # [B, T, H, D]
                per_token = rel(got, ref, (0, 2, 3))
                chunks = [float(rel(got[:, s:s + C], ref[:, s:s + C])) for s in range(0, case.T, C)]
                text += ("; per head " + " ".join(f"{v:.2e}" for v in rel(got, ref, (0, 1, 3)))
                         + "; per chunk " + " ".join(f"{v:.2e}" for v in chunks)
                         + f"; per token median {np.median(per_token):.2e}, max {per_token.max():.2e} at t = "
                         f"{int(per_token.argmax())}")
            print(text)


if __name__ == "__main__":
    {"padded": padded, "precision": precision, "where": where}[sys.argv[1]](*sys.argv[2:])
