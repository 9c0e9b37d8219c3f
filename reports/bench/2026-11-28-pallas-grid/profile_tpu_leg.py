"""Where the TPU leg's warm run spends its time at B1-T2048-H4 (gdn): cProfile of the second run, and the
jax-level split (per-primitive XLA execution is one call, so the Python side vs the compiled programs)."""
import cProfile, pstats, sys, time, io
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
import os
os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v6e-4"); os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
from cases.inputs import make_inputs
from harness.app.selection import case_from_id
from harness.ops import get_op
from harness.legs.tpu import TpuLeg
op_name = sys.argv[1]
cid = f"{op_name}.chunk/B1-T2048-H4-K128-V128/bf16/g=logsigmoid/16/C64/h0,dht"
case = case_from_id(cid); op = get_op(case.op); inputs = make_inputs(case, op.inputs(case))
leg = TpuLeg(force_interpret=True, compile_targets=())
t0 = time.perf_counter(); out = leg.run(op, case, inputs); t1 = time.perf_counter()
print("first", round(t1 - t0, 2), "grids", out.details.get("pallas_grid"))
pr = cProfile.Profile(); pr.enable()
t0 = time.perf_counter(); leg.run(op, case, inputs); t1 = time.perf_counter()
pr.disable(); print("second", round(t1 - t0, 2))
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25); print(s.getvalue()[:6000])
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumtime").print_stats(40); print(s.getvalue()[:9000])
