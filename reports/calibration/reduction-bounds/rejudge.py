"""Judge committed result rows of declared sums (dg_gamma, dA_log, ddt_bias) by the bound over contributions.

usage: python rejudge.py OUT.csv FILE.csv[.gz]...

For each ok/bound row of a tensor its op declares a sum, the case's float64 golden is computed again (or read from
the reference cache) from the same inputs (the row's input_sha256 is checked), with the magnitudes of the terms:
kappa = ||a|| / ||r||, and the error relative to the terms, rel_sum = rel_l2 / kappa. The rule before (rel_l2 <=
the rel_l2 bound of harness/core/policy.py at 36b3fe3, the commit before bounds over contributions) and after
(rel_sum <= the bound over contributions) are both evaluated. Writes one line per row to OUT.csv.
"""
import os
import subprocess
import sys
import types

import pandas as pd

from cases.case import Case
from cases.inputs import make_inputs
from harness.legs.registry import role_of
from harness.core.metrics import condition_number
from harness.ops import get_op
from harness.ops.reductions import magnitude_name, reduction_of
from harness.core.policy import CONTRIBUTIONS, bound_for
from harness.core.cache_dir import default_cache_dir
from harness.run.reference_cache import ReferenceCache

BEFORE = "36b3fe3"
old_policy = types.ModuleType("old_policy")
old_policy.__file__ = "harness/core/policy.py"
sys.modules["old_policy"] = old_policy  # dataclasses look their module up
source = subprocess.run(["git", "show", f"{BEFORE}:harness/core/policy.py"], capture_output=True, text=True, check=True)
exec(compile(source.stdout.replace("from .metrics import METRICS", "from harness.core.metrics import METRICS"),
             "old_policy", "exec"), old_policy.__dict__)

out, files = sys.argv[1], sys.argv[2:]
cache = ReferenceCache(default_cache_dir(os.environ))
lines = []
for path in files:
    df = pd.read_csv(path, keep_default_na=False, na_values=[""], dtype={"input_sha256": str})
    df = df[df["status"].isin(["ok", "bound"])]
    for case_id, rows in df.groupby("case_id", sort=False):
        case = Case.from_id(case_id)
        op = get_op(case.op)
        sums = {s.name for s in op.tensors(case) if reduction_of(s) is not None}
        rows = rows[rows["tensor"].isin(sums)]
        if rows.empty:
            continue
        inputs = make_inputs(case, op.inputs(case))
        if inputs.sha256 != rows["input_sha256"].iloc[0]:
            print(f"skip {case_id}: inputs changed since {path}", file=sys.stderr)
            continue
        gold = cache.get(op, case, inputs)
        for _, r in rows.iterrows():
            kappa = condition_number(gold[r["tensor"]], gold[magnitude_name(r["tensor"])])
            bound = bound_for(case.op, r["tensor"], case.dtype, role_of(r["leg"]), over=CONTRIBUTIONS)
            lines.append(dict(file=path, case_id=case_id, op=case.op, dtype=case.dtype, seed=case.seed,
                              tensor=r["tensor"], leg=r["leg"], rel_l2=r["rel_l2"], max_abs=r["max_abs"],
                              old_bound=old_policy.bound_for(case.op, r["tensor"], case.dtype, role_of(r["leg"])).rel_l2,
                              kappa=kappa, rel_sum=r["rel_l2"] / kappa, bound_sum=bound.rel_l2,
                              new_alarm=bool(r["rel_l2"] > bound.limit(kappa))))
        print(f"{case_id}: {len(rows)} rows", file=sys.stderr, flush=True)
df = pd.DataFrame(lines)
if len(df):
    df.insert(list(df.columns).index("old_bound") + 1, "old_alarm", df["rel_l2"] > df["old_bound"])
df.to_csv(out, index=False)
