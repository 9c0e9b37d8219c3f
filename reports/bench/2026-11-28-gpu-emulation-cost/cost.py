"""What issue 76's emulation costs the GPU leg against the leg before it: CPU-time ratios measured in one process.

    PARITY_CACHE_DIR=/tmp/some-dir python reports/bench/2026-11-28-gpu-emulation-cost/cost.py [--reps 3]

Two variants of the emulated GPU leg, alternated ``--reps`` times in one process after a warm-up (so the layouts
are read once, from the shipped file or the cache, as a user's second run reads them):

- "now": the leg as shipped (the tensor-core model of sm_90 for every dot, every float ``tl.sum`` in the compiled
  layout's order);
- "before": the leg as it was before issue 76: ``dots.mma_chain`` is the exact products summed in float64 and
  rounded once (what the leg did before the tensor-core model), and ``reduce_order=False`` (numpy's order).

The measure is this process's CPU time per case (``time.process_time``), so other work on the machine moves it
little; per token-head the ratio is the case's. Writes ``cost.csv`` beside this script and prints it.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import sys
import time
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
CASES = [
    "simple_gla.fused_recurrent/B1-T64-H1-K128-V128/fp32/g=logsigmoid/0.1,lb-5/C64/h0,dht",  # fp32 decode
    "gdn.fused_recurrent/B1-T64-H2-K128-V128/fp32/g=logsigmoid/0.1/C64/h0",
    "simple_gla.chunk/B1-T128-H2-K128-V128/fp32/g=logsigmoid/16/C64/dht",  # fp32 chunk: TF32 dots
    "gdn.chunk/B1-T128-H1-K128-V128/bf16/g=logsigmoid/0.1/C64/h0,dht",  # bf16 chunk
    "kda.chunk/B1-T100-H1-K64-V64/bf16/g=logsigmoid/16,lb-5/C64/h0,dht,use_beta_sigmoid_in_kernel=1,"
    "use_qk_l2norm_in_kernel=1",
]


def _tensor_core_cost():
    """reports/tensor-core/cost.py, whose ``exact_once`` (the dots before the tensor-core model) and ``token_heads``
    this measurement shares."""
    spec = importlib.util.spec_from_file_location("tensor_core_cost", HERE.parents[1] / "tensor-core" / "cost.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    if not os.environ.get("PARITY_CACHE_DIR"):
        sys.exit("cost.py: set PARITY_CACHE_DIR to a folder of its own (the shared caches stay untouched)")
    from harness.emulation.setup import enable_interpreter_mode

    enable_interpreter_mode()
    import harness.emulation as emulation
    from harness.app import case_from_id
    from harness.emulation import dots
    from harness.legs import make_leg
    from harness.run.reference_cache import ReferenceCache
    from harness.run.runner import Runner

    shared = _tensor_core_cost()
    exact_once, token_heads = shared.exact_once, shared.token_heads
    shipped_session, model_chain = emulation.triton_emulation, dots.mma_chain
    variants = {"now": (shipped_session, model_chain),
                "before": (functools.partial(shipped_session, reduce_order=False), exact_once)}
    refs = ReferenceCache(None)

    def run(variant: str, case: str) -> float:
        emulation.triton_emulation, dots.mma_chain = variants[variant]
        try:
            t0 = time.process_time()
            rows = Runner(make_leg("gpu"), refs).run_case(case_from_id(case))
            assert all(r["status"] in ("ok", "not_provided") for r in rows), (variant, case)
            return time.process_time() - t0
        finally:
            emulation.triton_emulation, dots.mma_chain = shipped_session, model_chain

    for case in CASES:  # warm-up: references, layouts, imports
        run("now", case)
    rows = []
    for rep in range(args.reps):
        for variant in (("now", "before") if rep % 2 == 0 else ("before", "now")):
            for case in CASES:
                rows.append(dict(case_id=case, rep=rep, variant=variant, cpu_s=run(variant, case)))
                print(rows[-1], flush=True)
    per_rep = pd.DataFrame(rows).pivot_table(index=["case_id", "rep"], columns="variant", values="cpu_s")
    per_rep["ratio"] = per_rep["now"] / per_rep["before"]
    cost = per_rep.groupby("case_id").agg(before_s=("before", "median"), now_s=("now", "median"),
                                          ratio_median=("ratio", "median"), ratio_min=("ratio", "min"),
                                          ratio_max=("ratio", "max"))
    cost["token_heads"] = [token_heads(c) for c in cost.index]
    cost["now_ms_per_token_head"] = 1e3 * cost.now_s / cost.token_heads
    pd.set_option("display.width", 250)
    print(cost.round(3).to_string())
    cost.to_csv(HERE / "cost.csv")


if __name__ == "__main__":
    main()
