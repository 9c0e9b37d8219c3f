"""Two pickles of check_tensors.py, tensor by tensor: how many are bit for bit, and the largest differences as
max|a - b| / max|a| (and rel-L2), the worst eight listed.

    python compare.py OLD.pkl NEW.pkl
"""
import pickle, numpy as np, sys
a = pickle.load(open(sys.argv[1], "rb")); b = pickle.load(open(sys.argv[2], "rb"))
worst = []; n = 0; same = 0
for cid in a:
    ta, tb = a[cid], b[cid]
    if isinstance(ta, str) or isinstance(tb, str):
        print("ERR", cid, ta if isinstance(ta, str) else tb); continue
    assert set(ta) == set(tb), (cid, set(ta) ^ set(tb))
    for k in ta:
        x, y = np.asarray(ta[k], np.float64), np.asarray(tb[k], np.float64)
        n += 1
        if np.array_equal(x, y): same += 1; continue
        m = np.abs(x).max()
        rel = np.abs(x - y).max() / m if m > 0 else np.inf
        l2 = np.linalg.norm(x - y) / np.linalg.norm(x)
        worst.append((rel, l2, cid, k))
worst.sort(reverse=True)
print(f"{n} tensors, {same} bit for bit, max rel (max-abs/max) {worst[0][0] if worst else 0:.3g}")
for w in worst[:8]: print(f"  {w[0]:.3g} relL2 {w[1]:.3g} {w[2]} {w[3]}")
