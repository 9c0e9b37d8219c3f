"""CI's time budget: the profile of a `.ci/run` (each stage's wall time) and the rule it is held to.

    python benchmarks/ci_budget.py profile STAGES.tsv --start T0 --end T1 --out PROFILE.json [--check-against REF]
        the table of a run's stages (stage, seconds, share of the total) from the lines .ci/stages.sh wrote
        (name, start, end, background|failed|"", tab-separated, epoch seconds), written as a profile; with
        --check-against, then held to the budget against the committed profile REF
    python benchmarks/ci_budget.py check PROFILE.json --against REF
        hold a profile to the budget

The budget (docs/ci.md says what each stage may spend):

- the whole run at most TOTAL_LIMIT_S (45 minutes; the hard limit is 90, the goal 40);
- no stage more than GROWTH (1.5) times its time in the committed profile, where it also grew by more than
  NOISE_S (60 s): a 10 s stage taking 16 s is a network's or a loaded disk's noise, not a budget spent.

A stage the committed profile lacks is new: it is named, and only the total limits it until the profile is
made again. Exit 1 names every stage over its budget; exit 2 on a profile that cannot be read. Only the
standard library: CI runs this with whatever python3 it has.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

TOTAL_LIMIT_S = 45 * 60
GROWTH = 1.5
NOISE_S = 60.0
FORMAT = 1


def read_stages(path: Path) -> list[dict]:
    """The stages of a run, in the order they ended: name, seconds, where it ran (foreground, background, or
    failed: the stage that stopped the run, timed up to the failure)."""
    stages = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        name, start, end, how = (line.split("\t") + [""] * 4)[:4]
        stages.append({"name": name, "seconds": round(float(end) - float(start), 1),
                       "ran": how or "foreground"})
    return stages


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def _memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def make_profile(stages: list[dict], total_s: float) -> dict:
    return {"format": FORMAT, "commit": _commit(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": {"cores": os.cpu_count(), "memory_gib": _memory_gib(), "python": platform.python_version()},
            "total_s": round(total_s, 1), "stages": stages}


def table(profile: dict) -> str:
    """The stages as a table: seconds and share of the whole run. A background stage ran beside the
    foreground ones, so the shares add up to more than 100 %."""
    total = profile["total_s"]
    width = max([len(s["name"]) for s in profile["stages"]] + [5])
    lines = [f"{'stage':<{width}}  {'seconds':>8}  {'share':>6}  ran", f"{'-' * width}  {'-' * 8}  {'-' * 6}  ---"]
    for s in profile["stages"]:
        lines.append(f"{s['name']:<{width}}  {s['seconds']:>8.0f}  {s['seconds'] / total:>6.1%}  {s['ran']}")
    lines.append(f"{'total':<{width}}  {total:>8.0f}  {1:>6.1%}  ({total / 60:.1f} min, commit {profile['commit'][:9]})")
    return "\n".join(lines)


def over_budget(profile: dict, reference: dict) -> list[str]:
    """Why ``profile`` is over the budget against the committed ``reference``: one line per stage (and for the
    total), empty when within it."""
    problems = []
    if profile["total_s"] > TOTAL_LIMIT_S:
        problems.append(f"total: {profile['total_s'] / 60:.1f} min, over the {TOTAL_LIMIT_S / 60:.0f} min budget")
    before = {s["name"]: s["seconds"] for s in reference["stages"]}
    for s in profile["stages"]:
        was = before.get(s["name"])
        if was is None or s["ran"] == "failed":
            continue
        if s["seconds"] > GROWTH * was and s["seconds"] - was > NOISE_S:
            problems.append(f"stage {s['name']}: {s['seconds']:.0f} s, {s['seconds'] / was:.2f}x its "
                            f"{was:.0f} s in the committed profile (at most {GROWTH}x)")
    return problems


def new_stages(profile: dict, reference: dict) -> list[str]:
    known = {s["name"] for s in reference["stages"]}
    return [s["name"] for s in profile["stages"] if s["name"] not in known]


def read_profile(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
        if data.get("format") != FORMAT or not isinstance(data.get("stages"), list):
            raise ValueError(f"not a format-{FORMAT} CI profile")
        return data
    except (OSError, ValueError) as exc:
        raise SystemExit(f"ci_budget: cannot read the profile {path}: {exc}") from None


def check(profile: dict, against: Path, reference: dict | None = None) -> int:
    """Hold ``profile`` to the budget against the committed profile at ``against`` (``reference``: already read);
    with none committed yet, the total alone."""
    if reference is None and not Path(against).exists():
        print(f"ci budget: no committed profile at {against}: the total alone is held to the budget")
        reference = {"stages": []}
    reference = reference or read_profile(against)
    fresh = new_stages(profile, reference)
    if fresh:
        print(f"ci budget: new stages, not in {against} (only the total limits them until it is made again): "
              f"{', '.join(fresh)}")
    problems = over_budget(profile, reference)
    for p in problems:
        print(f"ci budget: OVER: {p}", file=sys.stderr)
    if not problems:
        print(f"ci budget: within it ({profile['total_s'] / 60:.1f} of {TOTAL_LIMIT_S / 60:.0f} min; no stage "
              f"over {GROWTH}x its time in {against})")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("profile", help="the table and profile of a run's stages")
    p.add_argument("stages", type=Path)
    p.add_argument("--start", type=float, required=True)
    p.add_argument("--end", type=float, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--check-against", type=Path)
    c = sub.add_parser("check", help="hold a profile to the budget")
    c.add_argument("profile", type=Path)
    c.add_argument("--against", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.cmd == "check":
        return check(read_profile(args.profile), args.against)
    try:
        stages = read_stages(args.stages)
    except (OSError, ValueError) as exc:
        print(f"ci_budget: cannot read the stages {args.stages}: {exc}", file=sys.stderr)
        return 2
    profile = make_profile(stages, args.end - args.start)
    print(table(profile))
    # the committed profile is read before the new one is written: --out may be its path (making it again)
    against = args.check_against
    reference = read_profile(against) if against is not None and against.exists() else None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(profile, indent=1) + "\n")
    print(f"profile: {args.out}")
    return check(profile, against, reference) if against is not None else 0


if __name__ == "__main__":
    sys.exit(main())
