"""A candidate's history over its versions: per-version rows (stored, resumable), the gate per version against
one set of baseline rows, the bisection of each comparison's verdict and the full sweep.

Per version, ``OUT/versions/<version>/`` holds ``rows.csv`` (the candidate's rows of every (case, draw) measured
so far: a (version, case, draw) found there is never measured again) and ``state.json`` (``installed``,
``refused`` with the binding's reason, or ``install_failed`` with the installer's last line). A refused version and
one that did not install get rows too: ``unsupported`` with the reason, or ``error`` rows whose reason starts
``install failed:``; the history marks both versions as not judged.

The measuring and installing are handed in (:class:`History` takes an ``installer`` and a ``measure``), so that
``parity bisect`` runs each version in a process of its own over its installed folder while a test can hand in
rows of its own making."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import pandas as pd

from harness.core.results import atomic_write_text, read_results, write_csv
from harness.core.status import Status
from harness.judge.gate import apply_gate
from harness.legs.registry import version_key

from .envs import InstallFailed, RunFailed
from .versions import Version

JUDGED = ("pass", "fail", "inconclusive")
"""The verdicts a crossing is made of; any other (unsupported, install_failed, not measured) is not judged."""

BY_DESIGN = ("forward_only", "no_gradient", "not_provided")
"""Gate verdicts of tensors never compared, whatever the version: no bisection looks for their crossing."""

ERROR = "error"
"""A comparison whose candidate row is an ``error`` (the binding or the kernel raised at that version: an API the
binding does not fit, a crash). The gate fails it closed; a history marks it not judged, as ``git bisect skip``
does a commit that does not build, and keeps the reason."""

INSTALL_FAILED = "install_failed"
RUN_FAILED = "run_failed"
NOT_JUDGED = {INSTALL_FAILED: "install failed", RUN_FAILED: "its run ended without rows"}
"""Version states whose rows say nothing of the kernels: their comparisons take the state as verdict."""
_ORDER = ("fail", "inconclusive", "pass")  # a comparison's verdict: its worst gated row


class Installer(Protocol):
    def install(self, package: str, version: Version) -> Path: ...


Measure = Callable[[Path | None, list[str], Path], pd.DataFrame]
"""``measure(site, case_ids, scratch)``: the candidate's rows of ``case_ids``, with ``site`` (a version's installed
folder) first on the path; ``scratch``: a folder of its own for that version, kept between runs (resume)."""


@dataclass(frozen=True)
class BisectSettings:
    """One ``parity bisect``: the candidate leg, its package (the cache's folder name), the ordered versions, the
    output folder, the mode (``all``: every version; else bisect between ``good`` and ``bad``, each a version
    name, default the first and last), versions to ``skip``, the policy and the baseline leg, and the arguments
    that replay it."""

    leg: str
    package: str
    versions: tuple[Version, ...]
    out: Path
    policy: object
    baseline_leg: str
    sweep: bool = False
    good: str | None = None
    bad: str | None = None
    skip: tuple[str, ...] = ()
    argv: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def __post_init__(self):
        names = [v.name for v in self.versions]
        if len(names) < 2:
            raise ValueError(f"a bisection needs two versions or more; {len(names)} given ({', '.join(names)})")
        for flag, value in (("--good", self.good), ("--bad", self.bad), *(("--skip", s) for s in self.skip)):
            if value is not None and value not in names:
                raise ValueError(f"{flag} {value} is not one of the versions ({names[0]} .. {names[-1]})")
        if self.good and self.bad and names.index(self.good) >= names.index(self.bad):
            raise ValueError(f"--good {self.good} must come before --bad {self.bad} in the version order")


@dataclass
class Crossing:
    """A comparison's change of verdict: the last version judged before it and the first after it."""

    case_id: str
    tensor: str
    before: str | None
    after: str | None
    verdict_before: str = ""
    verdict_after: str = ""
    ratio_before: float = float("nan")
    ratio_after: float = float("nan")
    unjudged: list[str] = field(default_factory=list)  # versions between the two that could not be judged
    changes_seen: int = 0  # changes of verdict among the versions measured (more than 1: not monotone)
    note: str = ""

    def record(self) -> dict:
        return dict(self.__dict__, unjudged=" ".join(self.unjudged))


class History:
    """The rows, verdicts and crossings of one bisection (:class:`BisectSettings`), over ``cases`` (their ids,
    draws included), against ``baseline`` (the baseline leg's rows of those cases, made once). ``refusal(version)``:
    the binding's reason to refuse a version, or None."""

    def __init__(self, settings: BisectSettings, case_ids: list[str], baseline: pd.DataFrame, installer: Installer,
                 measure: Measure, refusal: Callable[[str], str | None] = lambda v: None,
                 say: Callable[[str], None] = print):
        self.settings, self.case_ids, self.say = settings, list(case_ids), say
        # exactly the (case, draw) ids measured: further draws of the baseline have no candidate rows to pair with
        self.baseline = baseline[baseline["case_id"].isin(self.case_ids)].reset_index(drop=True)
        self.installer, self.measure, self.refusal = installer, measure, refusal
        self.index = {v.name: i for i, v in enumerate(settings.versions)}
        self.verdicts: dict[str, pd.DataFrame] = {}  # version -> its comparisons (measured this run)
        self.states: dict[str, dict] = {}
        self.log_path = settings.out / "bisect-log.txt"
        self._log_lines: list[str] = []

    # ------------------------------------------------------------------ store
    def folder(self, version: str) -> Path:
        return self.settings.out / "versions" / version

    def _state(self, version: Version) -> dict:
        path = self.folder(version.name) / "state.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def _write_state(self, version: Version, state: dict) -> None:
        atomic_write_text(self.folder(version.name) / "state.json", json.dumps(state, indent=1) + "\n")

    def _stand_in_rows(self, version: Version, case_ids: list[str], status: str, reason: str) -> pd.DataFrame:
        """The candidate's rows of ``case_ids`` at a version that did not run: one per (case, tensor) of the
        baseline, ``status`` with ``reason``, no numbers."""
        rows = self.baseline[self.baseline["case_id"].isin(case_ids)].copy()
        for column in ("max_abs", "rel_l2", "ulp_max", "ulp_mean", "ulp_p99", "rel_l2_blocks", "worst_index",
                       "ref_at_worst", "got_at_worst", "bound_rel_l2", "nan", "inf", "wall_s", "details",
                       "compiled_for", "mxu_cost", "mxu_macs_fwd", "mxu_macs_bwd", "mxu_pass_macs_fwd",
                       "mxu_pass_macs_bwd"):
            if column in rows.columns:
                rows[column] = None
        rows["leg"], rows["status"], rows["reason"] = self.settings.leg, status, reason
        rows["versions"] = json.dumps({version_key(self.settings.leg): version.name})
        rows["repro"] = ""
        return rows

    def rows(self, version: Version) -> pd.DataFrame:
        """The candidate's rows at ``version`` of every selected (case, draw): those stored, and the rest made now
        (installed once; refused or not installed: stand-in rows, stored too)."""
        folder = self.folder(version.name)
        path = folder / "rows.csv"
        stored = read_results(path) if path.exists() else None
        done = set() if stored is None else set(stored["case_id"])
        todo = [c for c in self.case_ids if c not in done]
        if not todo:
            self.states[version.name] = self._state(version) or {"state": "installed"}
            return stored[stored["case_id"].isin(self.case_ids)].reset_index(drop=True)
        folder.mkdir(parents=True, exist_ok=True)
        state = self._state(version)
        why = self.refusal(version.name)
        made = None
        if why:
            state = {"state": "refused", "reason": why}
            made = self._stand_in_rows(version, todo, Status.UNSUPPORTED, f"{self.settings.leg} {version.name}: {why}")
        elif state.get("state") == INSTALL_FAILED:
            made = self._stand_in_rows(version, todo, Status.ERROR, f"install failed: {state['reason']}")
        else:
            try:
                site = self.installer.install(self.settings.package, version)
            except InstallFailed as exc:
                state = {"state": INSTALL_FAILED, "reason": str(exc)}
                made = self._stand_in_rows(version, todo, Status.ERROR, f"install failed: {exc}")
                self.say(f"bisect: {version.name} did not install: {exc}")
            else:
                state = {"state": "installed", "site": str(site)}
                self.say(f"bisect: {version.name}: {len(todo)} of {len(self.case_ids)} cases to measure "
                         f"({len(done)} stored)")
                try:
                    made = self.measure(site, todo, folder / "run")
                except RunFailed as exc:  # not stored: the next bisection runs these cases again
                    self.say(f"bisect: {version.name}: {exc}")
                    self.states[version.name] = {"state": RUN_FAILED, "reason": str(exc)}
                    failed = self._stand_in_rows(version, todo, Status.ERROR, str(exc))
                    return pd.concat([x for x in (stored, failed) if x is not None], ignore_index=True)
                state = self._refused_at_run(state, stored, made)
        self._write_state(version, state)
        self.states[version.name] = state
        rows = made if stored is None else pd.concat([stored, made], ignore_index=True)
        write_csv(rows, path)
        rows = read_results(path)
        return rows[rows["case_id"].isin(self.case_ids)].reset_index(drop=True)

    @staticmethod
    def _refused_at_run(state: dict, stored, made) -> dict:
        """``refused``, with the binding's reasons, for an installed version whose every row is ``unsupported``
        (its binding refused each case when it ran: a module the version lacks, a signature it does not have),
        else ``state``: the history's versions table then says why the version was not judged."""
        rows = made if stored is None else pd.concat([stored, made], ignore_index=True)
        if len(rows) == 0 or not (rows["status"] == Status.UNSUPPORTED).all():
            return state
        reasons = list(dict.fromkeys(str(r) for r in rows["reason"].fillna("")))
        return {**state, "state": "refused", "reason": "; ".join(reasons)}

    # ------------------------------------------------------------------ judge
    def judge(self, version: Version) -> pd.DataFrame:
        """The version's comparisons: per (case, tensor) the gate's verdict (its worst gated row), the ratio to the
        baseline on the policy's rel_l2 (else its first gated metric), both ε and the reason."""
        if version.name in self.verdicts:
            return self.verdicts[version.name]
        rows = self.rows(version)
        result = apply_gate(self.baseline, rows, self.settings.policy, allow_missing=True,
                            baseline_leg=self.settings.baseline_leg, candidate_leg=self.settings.leg,
                            names=(f"{self.settings.baseline_leg} rows", f"{self.settings.leg} {version.name} rows"))
        parity = result.parity[result.parity["case_id"] != "*"]
        metrics = list(self.settings.policy.metrics)
        main = "rel_l2" if "rel_l2" in metrics else metrics[0]
        def eps(frame):  # a status row (a bound, a non-finite value) carries no ratio: the rows' own ε give it
            first = frame[frame["draw"] == 0] if "draw" in frame.columns else frame
            values = pd.to_numeric(first[main], errors="coerce").astype(float)
            return {(c, t): e for c, t, e in zip(first["case_id"], first["tensor"], values)}

        base_eps, cand_eps = eps(self.baseline), eps(rows)
        first = rows[rows["draw"] == 0] if "draw" in rows.columns else rows
        errored = set(zip(first.loc[first["status"] == Status.ERROR, "case_id"],
                          first.loc[first["status"] == Status.ERROR, "tensor"]))
        out = []
        for (case_id, tensor), group in parity.groupby(["case_id", "tensor"], sort=False):
            verdicts = list(group["verdict"])
            verdict = next((v for v in _ORDER if v in verdicts), verdicts[0])
            if (case_id, tensor) in errored:  # the gate fails it closed; the history says it did not run
                verdict = ERROR
            on_main = group[group["metric"] == main]
            pick = on_main.iloc[0] if len(on_main) else group.iloc[0]
            reason_rows = group[group["verdict"] == verdict]
            reason_rows = reason_rows if len(reason_rows) else group
            b, c = base_eps.get((case_id, tensor), float("nan")), cand_eps.get((case_id, tensor), float("nan"))
            if len(on_main):
                b, c, ratio = pick["eps_gpu"], pick["eps_tpu"], pick["ratio"]
            else:
                ratio = c / b if b and b == b and c == c else float("nan")
            out.append({"version": version.name, "case_id": case_id, "tensor": tensor, "verdict": verdict,
                        "ratio": ratio, "eps_baseline": b, "eps_candidate": c,
                        "reason": str(reason_rows["reason"].iloc[0] or "")})
        frame = pd.DataFrame(out, columns=["version", "case_id", "tensor", "verdict", "ratio", "eps_baseline",
                                           "eps_candidate", "reason"])
        state = self.states.get(version.name, {}).get("state")
        if state in NOT_JUDGED:
            frame["verdict"] = state  # an install or a run that failed is no verdict on the kernels
        self.verdicts[version.name] = frame
        self._log(f"# {version.name}: " + ", ".join(f"{n} {v}" for v, n in
                                                  frame["verdict"].value_counts().sort_index().items()))
        return frame

    def verdict(self, version: Version, key: tuple[str, str]) -> tuple[str, float]:
        frame = self.judge(version)
        hit = frame[(frame["case_id"] == key[0]) & (frame["tensor"] == key[1])]
        if hit.empty:
            return "missing", float("nan")
        return str(hit["verdict"].iloc[0]), float(hit["ratio"].iloc[0])

    # -------------------------------------------------------------------- log
    def _log(self, line: str) -> None:
        self._log_lines.append(line)
        self.say(f"bisect: {line.lstrip('# ')}")

    def write_log(self) -> Path:
        s = self.settings
        head = ["# parity bisect log. Replay: parity bisect --replay THIS_FILE (the args line, then the marks; edit",
                "# or add good/bad/skip lines first, as with git bisect replay). Versions measured are stored under",
                "# versions/ and never measured again.",
                "args " + json.dumps(list(s.argv))]
        marks = [f"good {s.good}"] * bool(s.good) + [f"bad {s.bad}"] * bool(s.bad) + [f"skip {v}" for v in s.skip]
        atomic_write_text(self.log_path, "\n".join(head + marks + self._log_lines) + "\n")
        return self.log_path

    # ------------------------------------------------------------------ modes
    def active(self) -> list[Version]:
        return [v for v in self.settings.versions if v.name not in self.settings.skip]

    def sweep(self) -> pd.DataFrame:
        """Every version's comparisons (``--all``), in version order."""
        frames = [self.judge(v) for v in self.active()]
        return pd.concat(frames, ignore_index=True)

    def comparisons(self, table: pd.DataFrame) -> list[tuple[str, str]]:
        keys = table[["case_id", "tensor"]].drop_duplicates()
        return list(keys.itertuples(index=False, name=None))

    def bisect(self) -> list[Crossing]:
        """The first crossing of each comparison between ``good`` and ``bad`` (default: the first and the last
        version), found by halving, with skips: a version that cannot judge the comparison (refused, not installed,
        the binding refusing the case) is stepped over for the nearest one that can, as ``git bisect skip``."""
        versions = self.active()
        names = [v.name for v in versions]
        lo = names.index(self.settings.good) if self.settings.good else 0
        hi = names.index(self.settings.bad) if self.settings.bad else len(versions) - 1
        ends = pd.concat([self.judge(versions[lo]), self.judge(versions[hi])], ignore_index=True)
        by_design = ends[ends["verdict"].isin(BY_DESIGN)]  # never compared (a forward-only candidate's gradients)
        keys = [k for k in self.comparisons(ends) if k not in set(zip(by_design["case_id"], by_design["tensor"]))]
        return [self._bisect_one(key, versions, lo, hi) for key in keys]

    def _judged(self, versions, i, key, unjudged: set[int]) -> tuple[str, float] | None:
        if i in unjudged:
            return None
        verdict, ratio = self.verdict(versions[i], key)
        if verdict not in JUDGED:
            unjudged.add(i)
            return None
        return verdict, ratio

    def _bisect_one(self, key, versions, lo, hi) -> Crossing:
        tag = f"'{key[0]}' {key[1]}"
        unjudged: set[int] = set()
        while lo <= hi and self._judged(versions, lo, key, unjudged) is None:
            lo += 1
        while hi >= lo and self._judged(versions, hi, key, unjudged) is None:
            hi -= 1
        if lo >= hi:
            reason = "no version" if lo > hi else f"only {versions[lo].name}"
            self._log(f"# {tag}: {reason} of the range could judge it")
            return Crossing(*key, None, None, unjudged=[versions[i].name for i in sorted(unjudged)],
                            note=f"not judged: {reason} of the range could judge it")
        first = self._judged(versions, lo, key, unjudged)
        last = self._judged(versions, hi, key, unjudged)
        self._log(f"old {versions[lo].name} {tag} {first[0]}")
        if first[0] == last[0]:  # the same at both ends: a crossing is there only if the verdict returns; look inside
            probe = self._probe(versions, lo, hi, key, unjudged, first[0])
            if probe is None:
                self._log(f"same {versions[hi].name} {tag} {last[0]}")
                return Crossing(*key, None, None, first[0], last[0], first[1], last[1],
                                changes_seen=0, note=f"{first[0]} at {versions[lo].name} and at {versions[hi].name} "
                                "and at the version probed between: no crossing found (a history that changes "
                                "and changes back between probes is seen only by --all)")
            hi = probe
        self._log(f"new {versions[hi].name} {tag} {self._judged(versions, hi, key, unjudged)[0]}")
        while True:
            inside = [i for i in range(lo + 1, hi) if i not in unjudged]
            if not inside:
                break
            mid = (lo + hi) // 2
            found = None
            for i in sorted(inside, key=lambda i: (abs(i - mid), i)):
                judged = self._judged(versions, i, key, unjudged)
                if judged is not None:
                    found = (i, judged)
                    break
                self._log(f"skip {versions[i].name} {tag} {self.verdict(versions[i], key)[0]}")
            if found is None:
                break
            i, judged = found
            if judged[0] == first[0]:
                lo = i
                self._log(f"old {versions[i].name} {tag} {judged[0]}")
            else:
                hi = i
                self._log(f"new {versions[i].name} {tag} {judged[0]}")
        before, after = self._judged(versions, lo, key, unjudged), self._judged(versions, hi, key, unjudged)
        seen = [self.verdict(v, key)[0] for v in versions if v.name in self.verdicts]
        seen = [v for v in seen if v in JUDGED]
        changes = sum(a != b for a, b in zip(seen, seen[1:]))
        between = [versions[i].name for i in range(lo + 1, hi) if i in unjudged]
        note = "first crossing found by bisection"
        if changes > 1:
            note = (f"the verdict changes {changes} times among the versions measured (not monotone): this is one "
                    f"of the crossings; --all shows every one")
        if between:
            note += f"; between them {', '.join(between)} could not be judged, so the change is in one of those or at {versions[hi].name}"
        self._log(f"first-new {versions[hi].name} {tag}: {before[0]} at {versions[lo].name} -> {after[0]}")
        return Crossing(*key, versions[lo].name, versions[hi].name, before[0], after[0], before[1], after[1],
                        between, changes, note)

    def _probe(self, versions, lo, hi, key, unjudged, verdict) -> int | None:
        """A version between ``lo`` and ``hi`` whose verdict differs from the ends' (they agree): the judged one
        nearest the middle, or None when it agrees too."""
        mid = (lo + hi) // 2
        for i in sorted(range(lo + 1, hi), key=lambda i: (abs(i - mid), i)):
            judged = self._judged(versions, i, key, unjudged)
            if judged is None:
                continue
            return i if judged[0] != verdict else None
        return None


def crossings(table: pd.DataFrame, order: list[str]) -> list[Crossing]:
    """Every change of verdict of each comparison over a full sweep's ``table`` (versions in ``order``), the
    versions that could not judge it between two judged ones named."""
    found = []
    for (case_id, tensor), group in table.groupby(["case_id", "tensor"], sort=False):
        by = {r["version"]: r for r in group.to_dict("records")}
        last, skipped, changes = None, [], []
        for name in order:
            r = by.get(name)
            if r is None or r["verdict"] not in JUDGED:
                if last is not None:
                    skipped.append(name)
                continue
            if last is not None and r["verdict"] != last["verdict"]:
                changes.append(Crossing(case_id, tensor, last["version"], name, last["verdict"], r["verdict"],
                                        last["ratio"], r["ratio"], list(skipped)))
            last, skipped = r, []
        for c in changes:
            c.changes_seen = len(changes)
            c.note = "one crossing" if len(changes) == 1 else f"{len(changes)} crossings (not monotone)"
        judged = [by[n] for n in order if n in by and by[n]["verdict"] in JUDGED]
        if judged and not changes:  # the same verdict wherever judged: said, with the span of its ratio
            ratios = [r["ratio"] for r in judged]
            changes.append(Crossing(case_id, tensor, judged[0]["version"], None, judged[0]["verdict"],
                                    ratio_before=min(ratios), ratio_after=max(ratios), note=(
                                        f"{judged[0]['verdict']} at every version judged ({len(judged)}: "
                                        f"{judged[0]['version']} .. {judged[-1]['version']}), ratio "
                                        f"{min(ratios):.4g} to {max(ratios):.4g}")))
        found.extend(changes)
    return found


def repro(settings: BisectSettings, crossing: Crossing, extra: tuple[str, ...] = ()) -> str:
    """The command that measures the crossing's two versions on its case alone (from the cache)."""
    versions = {v.name: v for v in settings.versions}
    before, after = versions[crossing.before], versions[crossing.after]
    if before.checkout:
        span = ["--git", before.checkout, "--commits", f"{before.install}..{after.install}"]
    else:
        span = ["--versions", f"{settings.package}=={before.name},{after.name}"]
    return shlex.join(["parity", "bisect", "--candidate", settings.leg, *span, "--case", crossing.case_id, "--all",
                       *extra])
