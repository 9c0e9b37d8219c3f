import os, sys, time
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/work/main/benchmarks")
os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v6e-4"); os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
import jax._src.compiler as comp
orig = comp.backend_compile_and_load
log = []
def wrapped(backend, module, *a, **k):
    t = time.perf_counter(); r = orig(backend, module, *a, **k)
    name = str(module.operation.attributes["sym_name"]) if "sym_name" in module.operation.attributes else "?"
    log.append((time.perf_counter() - t, name, len(str(module)) if False else 0)); return r
comp.backend_compile_and_load = wrapped
import cpu_legs
from cases.inputs import make_inputs
from harness.app.selection import case_from_id
from harness.ops import get_op
for cid in sys.argv[1:]:
    case = case_from_id(cid); op = get_op(case.op)
    inputs = make_inputs(case, op.inputs(case))
    leg = sys.argv[0]
    run = cpu_legs.leg_runner(os.environ.get("LEG", "tpu"), op, case, inputs)
    log.clear(); t = time.perf_counter(); run(); tot = time.perf_counter() - t
    print(f"{cid}: first {tot:.2f}s, {len(log)} compiles, {sum(x[0] for x in log):.2f}s compiling")
    for s, n, _ in sorted(log, reverse=True)[:8]: print(f"   {s:.2f}s {n}")
