import os, sys, time, resource
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/work/main/benchmarks")
os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v6e-4"); os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
import harness, cpu_legs
from cases.inputs import make_inputs
from harness.app.selection import case_from_id
from harness.ops import get_op
case = case_from_id(sys.argv[1]); op = get_op(case.op)
inputs = make_inputs(case, op.inputs(case))
r0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
run = cpu_legs.leg_runner("tpu", op, case, inputs)
t = time.perf_counter(); run(); print(f"run {time.perf_counter()-t:.1f}s; maxrss before {r0/2**20:.2f} GiB after {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/2**20:.2f} GiB")
