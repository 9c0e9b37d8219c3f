"""Each smoke case through the reference leg (GOLD=1: the golden first), one process, no cache: its wall time and
XLA compiles (jax_log_compiles), then the compile time by program name. Usage: GOLD=1 python compiles.py <checkout> "" OUT.pkl"""
import sys, os, time, logging, collections, pickle
root = sys.argv[1]; sys.path.insert(0, root); os.chdir(root)
os.environ["PARITY_CACHE_DIR"] = ""
import jax
jax.config.update("jax_log_compiles", True)
from cases.suites import get_suite
from cases.inputs import make_inputs
from harness.ops import get_op
from harness.legs.ref import RefLeg
msgs = []
class H(logging.Handler):
    def emit(self, rec):
        m = rec.getMessage()
        if "Finished XLA compilation" in m or "Finished tracing" in m or "Finished jaxpr to MLIR" in m: msgs.append(m)
logging.getLogger("jax").addHandler(H()); logging.getLogger("jax").setLevel(logging.DEBUG)
cases = list(get_suite("smoke"))
GOLD = os.environ.get("GOLD") == "1"
sel = sys.argv[2] if len(sys.argv) > 2 else ""
out = []
for case in cases:
    if sel and not case.op.startswith(sel): continue
    op = get_op(case.op); inputs = make_inputs(case, op.inputs(case))
    n0 = len(msgs); t = time.perf_counter()
    try:
        from harness.run.reference_cache import ReferenceCache
        from harness.ops.base import call_k_first
        call_k_first(case, op.reference, inputs.as_float64(), method="chunk", compute_dtype="float64") if GOLD else None
        RefLeg("recurrent").run(op, case, inputs)
    except Exception as e: print("ERR", case.id, e)
    dt = time.perf_counter() - t
    mm = msgs[n0:]
    comp = [(m.split("Finished XLA compilation of ")[1].split(" in ")[0], float(m.split(" in ")[-1].split()[0])) for m in mm if "XLA compilation" in m]
    trace = sum(float(m.split(" in ")[-1].split()[0]) for m in mm if "tracing" in m)
    low = sum(float(m.split(" in ")[-1].split()[0]) for m in mm if "MLIR" in m)
    out.append((case.id, dt, comp, trace, low))
    print(f"{dt:6.2f}s compile {sum(c for _,c in comp):5.2f} in {len(comp):2d} trace {trace:4.2f} lower {low:4.2f} {case.id}", flush=True)
pickle.dump(out, open(sys.argv[3] if len(sys.argv)>3 else "/tmp/s12/cprof.pkl", "wb"))
tot = collections.Counter(); cnt = collections.Counter()
for _, _, comp, _, _ in out:
    for n, c in comp: tot[n] += c; cnt[n] += 1
print("total", sum(o[1] for o in out), "compile", sum(tot.values()), "trace", sum(o[3] for o in out), "lower", sum(o[4] for o in out))
for n, c in tot.most_common(25): print(f"{c:7.2f} {cnt[n]:3d} {n}")
