import sys, numpy as np
from harness.app import case_from_id
from harness.app.analysis import golden, run_case
cid = sys.argv[1]; seeds = range(int(sys.argv[2]))
for s in seeds:
    g = golden(case_from_id(cid).replace(seed=s))
    case, x = g.case, g.inputs
    out = {n: run_case(g, n).tensors for n in ("ref", "gpu", "tpu")}
    r = np.asarray(out["ref"]["dg"], np.float64).ravel()
    eg = np.asarray(out["gpu"]["dg"], np.float64).ravel() - r
    et = np.asarray(out["tpu"]["dg"], np.float64).ravel() - r
    nr = np.linalg.norm(r)
    # per-chunk error norm; also recompute dg from each leg's own dq, dk (what fraction comes from dq/dk errors)
    q = np.asarray(x["q"], np.float64).reshape(-1, case.K); k = np.asarray(x["k"], np.float64).reshape(-1, case.K)
    def from_grads(o):
        db = (q * np.asarray(o["dq"], np.float64).reshape(q.shape)).sum(1) - (k * np.asarray(o["dk"], np.float64).reshape(k.shape)).sum(1)
        return db
    dbr = from_grads(out["ref"])
    print(f"seed {s}: rel gpu {np.linalg.norm(eg)/nr:.3e} tpu {np.linalg.norm(et)/nr:.3e} ratio {np.linalg.norm(et)/np.linalg.norm(eg):.3f}",
          "| chunk0 g/t %.2e %.2e chunk1 g/t %.2e %.2e" % (np.linalg.norm(eg[:64]), np.linalg.norm(et[:64]), np.linalg.norm(eg[64:]), np.linalg.norm(et[64:])),
          "| db-err-from-grads g/t %.2e %.2e" % (np.linalg.norm(from_grads(out["gpu"]) - dbr), np.linalg.norm(from_grads(out["tpu"]) - dbr)),
          "| |dg| %.2e |db| %.2e" % (nr, np.linalg.norm(dbr)))
