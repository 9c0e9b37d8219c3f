"""Bound alarms before (harness/core/policy.py at 36b3fe3: rel_l2 over the reference) and after (declared sums over
their terms' magnitudes, this commit's harness/core/policy.py) on rows that carry rel_l2 and kappa.

usage: python summary.py FILE.csv[.gz]...   (rejudge.py's output, or result rows written with a kappa column)
"""
import subprocess
import sys
import types

import pandas as pd

from harness.legs.registry import role_of
from harness.core.policy import CONTRIBUTIONS, bound_for

old = types.ModuleType("old_policy")
old.__file__ = "harness/core/policy.py"
sys.modules["old_policy"] = old
src = subprocess.run(["git", "show", "36b3fe3:harness/core/policy.py"], capture_output=True, text=True, check=True).stdout
exec(compile(src.replace("from .metrics import METRICS", "from harness.core.metrics import METRICS"), "old", "exec"),
     old.__dict__)

frames = []
for path in sys.argv[1:]:
    d = pd.read_csv(path)
    if "bound_over" in d.columns:  # result rows: keep the declared sums' measured rows
        d = d[(d["bound_over"] == CONTRIBUTIONS) & d["status"].isin(["ok", "bound"])]
    frames.append(d[["case_id", "op", "dtype", "tensor", "leg", "rel_l2", "kappa"]])
d = pd.concat(frames).drop_duplicates(["case_id", "tensor", "leg"])
d["rel_sum"] = d["rel_l2"] / d["kappa"]
d["before"] = [r.rel_l2 > old.bound_for(r.op, r.tensor, r.dtype, role_of(r.leg)).rel_l2 for r in d.itertuples()]
d["after"] = [r.rel_l2 > bound_for(r.op, r.tensor, r.dtype, role_of(r.leg), over=CONTRIBUTIONS).limit(r.kappa)
              for r in d.itertuples()]
d["bound_sum"] = [bound_for(r.op, r.tensor, r.dtype, role_of(r.leg), over=CONTRIBUTIONS).rel_l2
                  for r in d.itertuples()]
g = d.groupby(["leg", "op", "dtype", "tensor"]).agg(rows=("rel_sum", "size"), rel_l2_max=("rel_l2", "max"),
                                                    kappa_max=("kappa", "max"), rel_sum_max=("rel_sum", "max"),
                                                    bound_sum=("bound_sum", "first"), alarms_before=("before", "sum"),
                                                    alarms_after=("after", "sum"))
print(f"{len(d)} rows of declared sums, {d['case_id'].nunique()} case-draws; alarms before {int(d['before'].sum())}, "
      f"after {int(d['after'].sum())}\n")
g = g.reset_index()
print("| " + " | ".join(g.columns) + " |\n|" + "---|" * len(g.columns))
for r in g.itertuples(index=False):
    print("| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in r) + " |")
