"""The reference leg's token-by-token check (RefLeg("recurrent")) on every case of the given suites whose op is
listed; its tensors pickled, to compare two checkouts with compare.py.

    python check_tensors.py CHECKOUT OUT.pkl SUITES OPS     e.g.  /tmp/old old.pkl smoke,regressions kda,gdn,gdn2
"""
import sys, os, pickle, time
root, out = sys.argv[1], sys.argv[2]
suites = sys.argv[3].split(",")
sys.path.insert(0, root); os.chdir(root)
from cases.suites import get_suite
from cases.inputs import make_inputs
from harness.ops import get_op
from harness.legs.ref import RefLeg
leg = RefLeg("recurrent")
res = {}
t0 = time.time()
for s in suites:
    for case in get_suite(s):
        if case.op.split(".")[0] not in ("kda", "gdn", "gdn2"):
            continue
        if case.id in res:
            continue
        op = get_op(case.op)
        try:
            inputs = make_inputs(case, op.inputs(case))
            res[case.id] = {k: v for k, v in leg.run(op, case, inputs).tensors.items() if v is not None}
        except Exception as e:
            res[case.id] = repr(e)
            print("ERR", case.id, repr(e)[:200], flush=True)
print(len(res), "cases", time.time() - t0, "s", flush=True)
pickle.dump(res, open(out, "wb"))
