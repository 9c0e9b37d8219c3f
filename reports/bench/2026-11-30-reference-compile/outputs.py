"""Every smoke case's golden (chunk) and check (recurrent) outputs, one process, no cache, timed per case; pickled
for compare.py. Usage: ROOT=<checkout> python outputs.py kda,gdn,gla,simple_gla OUT.pkl (XLA_FLAGS to try options)."""
import sys, os, time, pickle
ROOT = os.environ.get("ROOT", "/work/main"); sys.path.insert(0, ROOT); os.chdir(ROOT)
os.environ["PARITY_CACHE_DIR"] = ""
import jax
from cases.suites import get_suite
from cases.inputs import make_inputs
from harness.ops import get_op
from harness.ops.base import call_k_first
sel = sys.argv[1].split(","); outp = sys.argv[2]
res = {}; t0 = time.perf_counter()
for case in get_suite("smoke"):
    if not any(case.op.startswith(s) for s in sel): continue
    op = get_op(case.op); inputs = make_inputs(case, op.inputs(case))
    t = time.perf_counter()
    g = call_k_first(case, op.reference, inputs.as_float64())
    r = call_k_first(case, op.reference, inputs.as_float64(), method="recurrent", compute_dtype="float64")
    res[case.id] = ({k: None if v is None else __import__("numpy").asarray(v) for k, v in g.items()}, {k: None if v is None else __import__("numpy").asarray(v) for k, v in r.items()})
    print(f"{time.perf_counter()-t:6.2f} {case.id[:90]}", flush=True)
print("total", time.perf_counter() - t0)
pickle.dump(res, open(outp, "wb"))
