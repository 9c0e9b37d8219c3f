"""Where an emulated TPU case's first run goes: each XLA:CPU compile's time, then the warm run (README section 2).

    OPTS='[["xla_cpu_parallel_codegen_split_count", 1]]' python tpu_leg_compiles.py CASE_ID OUT.npz

OPTS: extra XLA options appended to harness.legs.tpu.INTERPRET_COMPILER_OPTIONS (JSON pairs); OUT.npz keeps the
leg's tensors, to compare bit for bit between option sets."""
import json
import os
import sys
import time

sys.path.insert(0, "/work/main"); sys.path.insert(0, "/work/main/benchmarks")
os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v6e-4"); os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
import numpy as np
import jax._src.compiler as comp

orig = comp.backend_compile_and_load
log = []


def timed(backend, module, *a, **k):
    t = time.perf_counter(); r = orig(backend, module, *a, **k)
    log.append((time.perf_counter() - t, str(module.operation.attributes["sym_name"]))); return r


comp.backend_compile_and_load = timed
import harness.legs.tpu as tpu
extra = json.loads(os.environ.get("OPTS", "[]"))
tpu.INTERPRET_COMPILER_OPTIONS = tpu.INTERPRET_COMPILER_OPTIONS + tuple(tuple(x) for x in extra)
import cpu_legs
from cases.inputs import make_inputs
from harness.app.selection import case_from_id
from harness.ops import get_op

case = case_from_id(sys.argv[1]); op = get_op(case.op)
run = cpu_legs.leg_runner("tpu", op, case, make_inputs(case, op.inputs(case)))
t = time.perf_counter(); r = run(); first = time.perf_counter() - t
t = time.perf_counter(); run(); warm = time.perf_counter() - t
print(f"OPTS={extra}: first {first:.2f}s warm {warm:.2f}s; {len(log)} compiles, {sum(s for s, _ in log):.2f}s")
for s, n in sorted(log, reverse=True)[:4]:
    print(f"   {s:.2f}s {n}")
if len(sys.argv) > 2:
    np.savez(sys.argv[2], **{k: np.asarray(v) for k, v in r.items() if v is not None})
