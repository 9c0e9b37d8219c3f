"""Where v2's (and v3's) final states land, under Pallas's two DMA timings.

For one case, run the candidate's binding (peers/tpu_inference.py) in Pallas TPU interpret mode twice: with the
interpreter's default ``dma_execution_mode="on_wait"`` (a copy reads its source when it is waited on, which the
harness runs with) and with ``"eager"`` (when it starts). For each request, print the rel-L2 of its returned state
``ht[i]`` against the float64 reference's ``ht[j]`` for every j: the j it matches is the request whose state the
slot holds.

    python reports/peers/tpu-inference/v2-v3/locate_slots.py tpu-inference-v2 'CASE_ID'
"""

from __future__ import annotations

import sys

import numpy as np


def main(leg: str, case_id: str) -> None:
    from jax.experimental.pallas import tpu as pltpu

    from cases.case import Case
    from cases.inputs import make_inputs
    from harness.emulation.pallas_refs import ref_reshapes
    from harness.legs.external import INTERPRET_CHIP, tpu_info_for
    from harness.legs.registry import implementations, load_implementation
    from harness.ops import get_op

    case = Case.from_id(case_id)
    op = get_op(case.op)
    arrays = make_inputs(case, op.inputs(case)).arrays
    want = op.reference(case, {n: a.astype(np.float64) for n, a in arrays.items()})["ht"]
    binding = load_implementation(leg, implementations()[leg]).bindings[case.op]
    for mode in ("on_wait", "eager"):
        params = pltpu.InterpretParams(uninitialized_memory="nan", dma_execution_mode=mode)
        with tpu_info_for(INTERPRET_CHIP), ref_reshapes(), pltpu.force_tpu_interpret_mode(params):
            got = np.asarray(binding.forward(case, arrays, None)["ht"], np.float64)
        print(f"dma_execution_mode={mode}")
        for i in range(len(got)):
            err = [np.linalg.norm(got[i] - want[j]) / np.linalg.norm(want[j]) for j in range(len(want))]
            j = int(np.argmin(err))
            print(f"  request {i:2d}: rel_l2 vs its own state {err[i]:.2e}; closest: request {j} ({err[j]:.2e})")


if __name__ == "__main__":
    main(*sys.argv[1:3])
