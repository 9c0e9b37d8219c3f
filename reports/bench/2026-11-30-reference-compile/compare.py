"""Each tensor that differs between two pickles of outputs.py: golden or check, name, max |a-b| / max |a|, elements
that differ, size, case. Usage: python compare.py BEFORE.pkl AFTER.pkl"""
import pickle, sys, numpy as np
a = pickle.load(open(sys.argv[1], "rb")); b = pickle.load(open(sys.argv[2], "rb"))
for cid in a:
    for i in range(2):
        for k, x in a[cid][i].items():
            y = b[cid][i][k]
            if x is None: continue
            if not np.array_equal(x, y, equal_nan=True):
                d = np.max(np.abs(x - y)) / max(np.max(np.abs(x)), 1e-300)
                print(["gold","check"][i], k, f"{d:.2g}", (x != y).sum(), x.size, cid[:80])
