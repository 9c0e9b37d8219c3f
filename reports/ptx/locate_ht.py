"""Where fla's and this project's fused-recurrent final states (ht) differ from the float64 reference, per packed
sequence, with fla emulated as Triton compiles it (products fused into their adds: harness/emulation/ptx_arith.py)
and as numpy rounds (every operation rounded). README.md quotes its output.

    python reports/ptx/locate_ht.py CASE_ID [CASE_ID ...]
"""

import sys

import numpy as np

from harness.app.analysis import f64, golden, rel_l2 as rel, run_case


def main(case_ids):
    from harness.emulation import triton_interpreter

    defaults = triton_interpreter.triton_emulation.__wrapped__.__kwdefaults__
    for case_id in case_ids:
        g = golden(case_id)
        case, gold = g.case, f64(g.tensors["ht"])
        axes = tuple(range(1, gold.ndim))  # one value per packed sequence
        got = {}
        for arith in (True, False):
            defaults["ptx_arith"] = arith
            got[f"fla, {'PTX' if arith else 'numpy'} arithmetic"] = run_case(g, "gpu").tensors["ht"]
        defaults["ptx_arith"] = True
        got["this project's TPU kernel"] = run_case(g, "tpu").tensors["ht"]
        print(case_id)
        print(f"  sequence lengths {np.diff(case.cu_seqlens).tolist()}; ht rel_l2 per sequence, and over all:")
        for name, ht in got.items():
            per = " ".join(f"{v:.3e}" for v in rel(ht, gold, axes))
            print(f"  {name:28s} {per}   all {rel(ht, gold, None):.3e}")


if __name__ == "__main__":
    main(sys.argv[1:])
