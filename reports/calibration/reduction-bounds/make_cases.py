"""Write cases.toml: every smoke and regressions case with a tensor its op declares a sum (a reduction gradient),
at the fresh seeds 100-123 (draws no other calibration used: reports/calibration/* use seeds 0-23).

usage: python make_cases.py [--skip-heavy] > cases.toml
"""
import sys

from cases.suites import get_suite
from harness.ops import get_op
from harness.ops.reductions import reduction_of

SEEDS = range(100, 124)
HEAVY = "H16"  # the three B1-T256-H16 cases: minutes of the emulated TPU leg per draw on this machine

ids = []
for suite in ("smoke", "regressions"):
    for case in get_suite(suite):
        op = get_op(case.op)
        if not any(reduction_of(s) is not None for s in op.tensors(case)):
            continue
        if "--skip-heavy" in sys.argv and f"-{HEAVY}-" in case.id:
            continue
        if case.id not in ids:
            ids.append(case.id)
print(f"# {len(ids)} cases x {len(SEEDS)} draws (seeds {SEEDS.start}-{SEEDS.stop - 1})")
for seed in SEEDS:
    for cid in ids:
        from cases.case import Case
        print(f'[[case]]\nid = "{Case.from_id(cid).replace(seed=seed).id}"')
