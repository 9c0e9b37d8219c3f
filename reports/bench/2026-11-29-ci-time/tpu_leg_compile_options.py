import os, sys, time, json
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/work/main/benchmarks")
os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v6e-4"); os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
import numpy as np
import jax._src.compiler as comp
orig = comp.backend_compile_and_load
log = []
def wrapped(backend, module, *a, **k):
    t = time.perf_counter(); r = orig(backend, module, *a, **k)
    log.append((time.perf_counter() - t, str(module.operation.attributes["sym_name"]))); return r
comp.backend_compile_and_load = wrapped
import harness.legs.tpu as tpu
extra = json.loads(os.environ.get("OPTS", "[]"))
tpu.INTERPRET_COMPILER_OPTIONS = tpu.INTERPRET_COMPILER_OPTIONS + tuple(tuple(x) for x in extra)
import cpu_legs
from cases.inputs import make_inputs
from harness.app.selection import case_from_id
from harness.ops import get_op
cid = sys.argv[1]
case = case_from_id(cid); op = get_op(case.op)
inputs = make_inputs(case, op.inputs(case))
run = cpu_legs.leg_runner("tpu", op, case, inputs)
t = time.perf_counter(); r = run(); tot = time.perf_counter() - t
t = time.perf_counter(); run(); warm = time.perf_counter() - t
big = {n: s for s, n in log if "backward" in n or "forward_vjp" in n}
print(f"OPTS={extra}: first {tot:.2f}s warm {warm:.2f}s", {k: round(v, 2) for k, v in big.items()})
np.savez(sys.argv[2], **{k: np.asarray(v) for k, v in r.items() if v is not None})
