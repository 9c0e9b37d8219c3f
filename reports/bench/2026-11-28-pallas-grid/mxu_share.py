"""The TPU leg's warm run with and without the MXU model (mxu_model=False: XLA:CPU's exact f32 dots instead of
the modeled bf16 passes), both at the leg's level 0: the model's share of the cost (README.md). argv[1]: a case id."""
import dataclasses, os, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v6e-4"); os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
from cases.inputs import make_inputs
from harness.app.selection import case_from_id
from harness.legs.tpu import TpuLeg
from harness.ops import get_op

case = case_from_id(sys.argv[1]); op = get_op(case.op); inputs = make_inputs(case, op.inputs(case))
for model in (True, False):
    leg = TpuLeg(force_interpret=True, compile_targets=())
    ctx = type(leg).context
    leg.context = lambda leg=leg, ctx=ctx: dataclasses.replace(ctx(leg), mxu_model=model)
    leg.run(op, case, inputs)
    t0 = time.perf_counter(); leg.run(op, case, inputs); t1 = time.perf_counter()
    print(f"mxu_model={model}: warm {t1 - t0:.3f} s", flush=True)
