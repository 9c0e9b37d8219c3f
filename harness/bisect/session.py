"""``parity bisect`` as one record and one method: :class:`BisectRequest` (what the command line asked, built by
the front) and :func:`run_bisection` (the versions resolved, PyPI's dates read now and stored; the output folder
checked; the baseline's rows made or taken once; then :func:`harness.bisect.run.bisect`, docs/bisect.md)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd

from cases.case import Case


class BisectInterrupted(Exception):
    """Ctrl-C during a bisection: every version's finished cases are kept."""


@dataclasses.dataclass(frozen=True)
class BisectRequest:
    """One ``parity bisect``, as the front read it."""

    candidate: str  # the leg bisected (a candidate, or the baseline against its own rows)
    cases: tuple[Case, ...]  # the selected cases
    policy: object  # the gate's policy, loaded once
    versions: str | None = None  # a PyPI version spec (--versions), or
    git: Path | None = None  # a git checkout (--git) and
    commits: str | None = None  # its commits A..B (--commits)
    out: Path | None = None  # the output folder (None: reports/bisect/<candidate>)
    force: bool = False  # write into a folder that holds another bisection
    sweep: bool = False  # every version, not a bisection
    good: str | None = None
    bad: str | None = None
    skip: tuple[str, ...] = ()
    argv: tuple[str, ...] = ()  # the arguments that replay it (its log's args line)
    baseline_rows: tuple[Path, ...] = ()  # the baseline's rows made elsewhere (else made here, once, and kept)
    recipe: object = None  # the candidate's leg recipe (harness.run.recipe.LegRecipe): each version's run
    baseline_recipe: object = None  # the baseline's, run once here when no --baseline-rows
    cache: Path = Path.home() / ".cache" / "linear-attn-parity" / "bisect"  # the versions' installs
    uv: str | None = None  # the uv binary

    def __post_init__(self):
        from harness.legs.registry import leg_spec

        role = leg_spec(self.candidate).role
        if role not in ("candidate", "baseline"):  # the baseline: its own history, against its own rows
            raise ValueError(f"--candidate {self.candidate} is the {role} leg: bisect a candidate, or the baseline "
                             f"leg against its own rows")
        if bool(self.versions) == bool(self.git):
            raise ValueError("give the versions: --versions SPEC (PyPI releases) or --git DIR --commits A..B")
        if bool(self.git) != bool(self.commits):
            raise ValueError("--git DIR and --commits A..B go together")


def run_bisection(request: BisectRequest) -> dict:
    """The bisection ``request`` asks for; what :func:`harness.bisect.run.bisect` found."""
    from harness.bisect.envs import LegInProcess, UvInstaller
    from harness.bisect.history import BisectSettings, History
    from harness.bisect.run import bisect
    from harness.bisect.versions import declared_refusal, git_versions, pypi_versions
    from harness.legs.registry import default_leg, leg_spec, load_implementation
    from harness.run.result_file import writable_dir

    r = request
    target = getattr(leg_spec(r.candidate).build, "target", None)
    impl = load_implementation(r.candidate, target) if target else None
    notes = ()
    if r.versions:
        package, versions, notes = pypi_versions(r.versions)
        refusal = declared_refusal(getattr(impl, "version_refusals", ()))
    else:
        versions = git_versions(Path(r.git), r.commits)
        package, refusal = Path(r.git).resolve().name, declared_refusal(())
    out = writable_dir(r.out or Path("reports/bisect") / r.candidate)
    _check_out(out, r.candidate, package, r.force)
    base = default_leg("baseline")
    settings = BisectSettings(leg=r.candidate, package=package, versions=tuple(versions), out=out, policy=r.policy,
                              baseline_leg=base, sweep=r.sweep, good=r.good, bad=r.bad, skip=r.skip, argv=r.argv,
                              notes=tuple(notes))
    ids = [c.id for c in r.cases]
    baseline, extra = _baseline(r, base, ids, out)
    history = History(settings, ids, baseline, UvInstaller(r.cache, r.uv),
                      LegInProcess(r.recipe), refusal)
    try:
        return bisect(history, repro_extra=extra)
    except KeyboardInterrupt:
        raise BisectInterrupted(f"bisect interrupted; every version's finished cases are kept under "
                                f"{out / 'versions'}: the same command continues without measuring them again") from None


def _check_out(out: Path, leg: str, package: str, force: bool) -> None:
    """A ValueError when ``out`` holds another bisection, or history files no bisect wrote, and not ``force``."""
    record = out / "bisect.json"
    if force:
        return
    if record.exists():
        earlier = json.loads(record.read_text())
        if (earlier.get("leg"), earlier.get("package")) != (leg, package):
            raise ValueError(f"{out} holds the bisection of {earlier.get('leg')} ({earlier.get('package')}); give "
                             f"another --out, or --force to write beside it")
    elif any(out.glob("history.*")):
        raise ValueError(f"{out} holds history files no parity bisect wrote there: give another --out, or --force")


def _baseline(r: BisectRequest, base: str, ids: list[str], out: Path) -> tuple[pd.DataFrame, tuple[str, ...]]:
    """The baseline's rows of the cases (taken from ``--baseline-rows``, or made here once and kept in
    ``out/baseline/rows.csv``) and the arguments a repro gives to take them."""
    from harness.bisect.envs import LegInProcess
    from harness.core.results import read_results, write_csv
    from harness.judge.baseline import rows_made_elsewhere
    from harness.judge.gate import of_cases

    if r.baseline_rows:
        return (rows_made_elsewhere(r.baseline_rows, base, ids),
                tuple(a for p in r.baseline_rows for a in ("--baseline-rows", str(p))))
    kept = out / "baseline" / "rows.csv"
    have = read_results(kept) if kept.exists() else None
    todo = ids if have is None else [i for i in ids if i not in set(have["case_id"])]
    if todo:
        print(f"bisect: the {base} leg over {len(todo)} cases, once -> {kept}")
        made = LegInProcess(r.baseline_recipe)(None, todo, out / "baseline" / "run")
        have = made if have is None else pd.concat([have, made], ignore_index=True)
        write_csv(have, kept)
    return have[of_cases(have, ids)].reset_index(drop=True), ("--baseline-rows", str(kept))
