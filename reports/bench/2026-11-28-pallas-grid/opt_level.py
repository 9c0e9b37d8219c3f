"""XLA:CPU compile options of the TPU leg's interpret-mode run against its default (level 0): warm time and which
tensors move, on one case id (argv[1]). Measured 2026-11-28, README.md here."""
import dataclasses, sys, time, os
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v6e-4"); os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
import numpy as np
from cases.inputs import make_inputs
from harness.app.selection import case_from_id
from harness.ops import get_op
from harness.legs.tpu import TpuLeg
cid = sys.argv[1]
case = case_from_id(cid); op = get_op(case.op); inputs = make_inputs(case, op.inputs(case))
def leg_with(opts):
    leg = TpuLeg(force_interpret=True, compile_targets=())
    ctx = type(leg).context
    leg.context = lambda: dataclasses.replace(ctx(leg), compiler_options=opts)
    return leg
base = None
for opts in [(("xla_backend_optimization_level", 0),), (("xla_cpu_max_isa", "AVX"),),
             (("xla_cpu_max_isa", "AVX"), ("xla_backend_optimization_level", 0)), ()]:
    leg = leg_with(opts)
    t0 = time.perf_counter(); leg.run(op, case, inputs); t1 = time.perf_counter()
    out = leg.run(op, case, inputs).tensors; t2 = time.perf_counter()
    out = {k: np.asarray(v) for k, v in out.items() if v is not None}
    if base is None: base = out
    diff = {k: int((v.view(np.uint8) != base[k].view(np.uint8)).sum()) for k, v in out.items() if v.tobytes() != base[k].tobytes()}
    print(opts, "first", round(t1 - t0, 2), "second", round(t2 - t1, 3), "differ(bytes)", diff, flush=True)
