"""Compare two ``parity all`` output folders: every result file (ref, gpu, tpu, causality-*, parity.csv, and a
candidate's peers.csv) row by row on every column but ``git_commit``, ``timestamp`` and ``wall_s``, read as text
(so a float must print the same to match); and parity.md as text. Exit 1 on any difference.

    python compare.py BEFORE_DIR AFTER_DIR
"""
import sys
from pathlib import Path
import pandas as pd

VOLATILE = {"git_commit", "timestamp", "wall_s"}
a, b = Path(sys.argv[1]), Path(sys.argv[2])
names = sorted({p.name for p in a.glob("*.csv")} | {p.name for p in b.glob("*.csv")})
bad = 0
for name in names:
    pa, pb = a / name, b / name
    if not (pa.exists() and pb.exists()):
        print(f"{name}: only in {'before' if pa.exists() else 'after'}"); bad += 1; continue
    x = pd.read_csv(pa, dtype=str, keep_default_na=False)
    y = pd.read_csv(pb, dtype=str, keep_default_na=False)
    if list(x.columns) != list(y.columns):
        print(f"{name}: columns differ {set(x.columns) ^ set(y.columns)}"); bad += 1; continue
    cols = [c for c in x.columns if c not in VOLATILE]
    if len(x) != len(y):
        print(f"{name}: {len(x)} vs {len(y)} rows"); bad += 1; continue
    diff = (x[cols] != y[cols])
    n = int(diff.any(axis=1).sum())
    dc = [c for c in cols if diff[c].any()]
    print(f"{name}: {len(x)} rows x {len(cols)} columns compared, {n} rows differ" + (f" in {dc}" if n else ""))
    if n:
        bad += 1
        i = diff.any(axis=1).idxmax()
        for c in dc[:4]:
            print(f"   {c}: {x.loc[i, c]!r} -> {y.loc[i, c]!r}")
for other in ("parity.md",):
    ta, tb = (a / other).read_text(), (b / other).read_text()
    print(f"{other}: {'identical' if ta == tb else 'differs'}")
sys.exit(1 if bad else 0)
