"""A run: one command's settings, its reference cache, its worker pool and the runners it builds, and the stages
that hand each other rows.

``parity all`` is the sequence of stages (docs/architecture.md)::

    legs ──▶ causality ──▶ gate ──▶ draws (the sequential test) ──▶ report

- :meth:`Run.leg`: one leg over the cases into its result file (appended case by case, resumable);
- :meth:`Run.causality`: the causality and isolation check of one leg;
- :meth:`Run.gate`: the gate of a candidate's rows against the baseline's, with the draws that decide its
  inconclusive comparisons (:func:`harness.judge.sequential.sequential_gate`), which the run makes and folds
  into both legs' result files;
- :func:`report_gate`: parity.csv, .md, .html, .png, JUnit XML, and the lines a terminal shows;
- :meth:`Run.compile`: ``parity compile``'s walk of the cases through the pool.

``parity run``, ``parity causality``, ``parity compile``, ``parity calibrate`` and ``parity all`` each make one
:class:`Run` from their settings (:mod:`harness.app.settings`); the pytest plugin builds its runners with the same
:func:`harness.app.workers.make_runner`."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

import pandas as pd

from cases.case import Case
from harness.app.settings import GateSettings, RunSettings
from harness.app.workers import Workers, make_runner
from harness.core.results import atomic_write_text, rows_to_frame, summarize, write_csv
from harness.core.status import CAUSALITY_FAILING, FAILING
from harness.judge.gate import GateResult, undrawn_id
from harness.judge.sequential import sequential_gate
from harness.probes.causality import causality_cases, causality_frame
from harness.report.html_report import write_html_report
from harness.report.reports import markdown
from harness.run.reference_cache import ReferenceCache
from harness.run.result_file import ResultFile, fold_tracebacks, write_check_file
from harness.run.runner import Runner


class Interrupted(Exception):
    """Ctrl-C during a leg: its finished cases are kept in the partial file."""


def failing(df: pd.DataFrame) -> bool:
    """Whether a leg's rows hold a failing status (a bound, a non-finite value, an error)."""
    return bool(df["status"].isin(FAILING).any())


def causality_failing(df: pd.DataFrame) -> bool:
    """Whether a causality check's rows hold a leak or an error."""
    return bool(df["status"].isin(CAUSALITY_FAILING).any())


class Run:
    """One command's run. Use as a context manager: the worker pool (started on the first case that needs a leg
    run) is shut down when it ends. ``say``: where the progress lines go (print)."""

    def __init__(self, settings: RunSettings, say: Callable[[str], None] = print):
        self.settings = settings
        self.say = say
        self.reference_cache = ReferenceCache("default" if settings.reference_cache else None)
        self.workers = Workers(settings.jobs, settings.case_timeout)
        self.frames: dict[str, pd.DataFrame] = {}  # each leg's rows so far, every draw
        self.paths: dict[str, Path] = {}  # each leg's result file
        self.taken: dict[str, str | None] = {}  # legs whose rows were made elsewhere: the Python that runs each
        self.undrawn: dict[str, dict[str, Case]] = {}  # per taken leg, the draws a gate needed that it lacks
        self._cases: list[Case] | None = None

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.workers.close(wait=exc_type is None)  # interrupted: leave the workers' cases behind

    @property
    def cases(self) -> list[Case]:
        """The selected cases (read once; a ValueError with one line for a bad selection)."""
        if self._cases is None:
            self._cases = self.settings.selection.cases()
        return self._cases

    # ---------------------------------------------------------------- runners
    def runner(self, name: str, options: dict | None = None, reference_cache: ReferenceCache | None = None,
               suite: bool = True, leg_cache: bool = True) -> tuple[Runner, dict]:
        """A runner of leg ``name`` (built with the settings' options for its role, or ``options``) and the
        options it was built with, which a worker rebuilds it from. ``suite``: the rows' suite column is the
        selection's; ``leg_cache``: the leg's output cache, where it has one."""
        options = self.settings.legs.for_leg(name) if options is None else options
        runner = make_runner(name, options, reference_cache or self.reference_cache,
                             suite=self.settings.selection.suite_label if suite else "", leg_cache=leg_cache,
                             read_cache=self.settings.read_leg_cache)
        return runner, options

    def _progress(self, label: str) -> str | None:
        return label if self.settings.progress else None

    def result_path(self, name: str, prefix: str = "") -> Path:
        """Where leg ``name``'s rows of the selection go (``prefix``: ``causality-`` for its check file)."""
        return self.settings.out / (prefix + self.settings.selection.result_name(name, tag=self.settings.tag,
                                                                                  cases=self.cases))

    # ----------------------------------------------------------------- stages
    def leg(self, name: str, cases: list[Case] | None = None, path: Path | None = None) -> pd.DataFrame:
        """Leg ``name`` over ``cases`` (default: the selection) into its result file, or into ``path`` (a
        scratch file of the sequential test's draws, never resumed); the rows are kept in :attr:`frames`
        (replacing a leg's earlier rows when ``path`` is not given). Ctrl-C raises :class:`Interrupted`."""
        cases = self.cases if cases is None else cases
        runner, options = self.runner(name)
        leg_cache = runner.leg_cache
        resume = self.settings.resume and path is None
        target = path or self.result_path(name)
        t0 = time.perf_counter()
        with ResultFile(target, runner.provenance, force=self.settings.force, resume=resume) as out:
            todo = [c for c in cases if c.id not in out.done]
            if out.cut:
                self.say(f"{name}: resuming {out.partial}: the rows of {out.cut} were cut inside their write; "
                         f"they are dropped and the case runs again")
            if out.done:
                self.say(f"{name}: resuming {out.partial}: {len(cases) - len(todo)} of {len(cases)} cases already "
                         f"done")
            try:
                self.workers.run(runner, options, todo, on_case=lambda case, rows: out.append(rows),
                                 progress=self._progress(f"{name} leg"))
            except KeyboardInterrupt:
                raise Interrupted(f"{name} leg interrupted; the finished cases are kept in {out.partial}. Continue "
                                  f"with the same command plus --resume (parity gate refuses that file unless "
                                  f"given --allow-partial, and never passes it)") from None
            df = out.finish()
        self.say(f"{name}: {len(todo)} cases in {time.perf_counter() - t0:.1f} s "
                 f"({runner.provenance['mode']}, {runner.provenance['device']}) -> {target}")
        if leg_cache is not None:
            self.say(f"{name}: {leg_cache.summary(leg_cache.hits, len(todo))}")
        self.say(f"  rows: {summarize(df)}")
        self._say_tracebacks(out.tracebacks, todo)
        if path is None:
            self.frames[name], self.paths[name] = df, target
        return df

    def _say_tracebacks(self, path: Path, ran: list[Case]) -> None:
        """Where the error rows' full tracebacks are; the traceback itself when the run was one case (a row's
        repro command), so that running the repro shows what the one-line reason leaves out."""
        if not path.exists():
            return
        text = path.read_text(encoding="utf-8")
        if len(ran) == 1 and ran[0].id in text:
            self.say(text.rstrip())
        self.say(f"  the error rows' full tracebacks, under each case's repro: {path}")

    def take(self, name: str, path: Path, rows: pd.DataFrame, python: str | None = None) -> None:
        """Leg ``name``'s rows made elsewhere (``--baseline-rows``): judged, never run in this process. The draws a
        gate needs that they lack are made by ``python``, that stack's interpreter (:meth:`draw_elsewhere`), or,
        without one, said as the command to run there (:meth:`undrawn_lines`)."""
        self.frames[name], self.paths[name] = rows, path
        self.taken[name] = python

    def draw_elsewhere(self, name: str, cases: list[Case]) -> pd.DataFrame:
        """Leg ``name``'s rows of ``cases`` (draws a gate needs), made by its stack's Python (:meth:`take`) with
        this project's ``parity run`` there, kept in ``OUT/<leg>.draws.csv`` (pooled with earlier draws) and
        returned. A run that fails there is a ValueError with its last lines."""
        import subprocess
        import tempfile

        from harness.core.results import read_results

        with tempfile.TemporaryDirectory(dir=self.settings.out, prefix=f".{name}-draws-") as scratch:
            command = [self.taken[name], "-m", "harness.cli", "run", "--backend", name, "--out", scratch,
                       "--no-progress", "--jobs", str(self.settings.jobs), *[a for c in cases for a in ("--case", c.id)]]
            self.say(f"{name}: {len(cases)} draws made by {self.taken[name]} (the {name} leg's stack)")
            done = subprocess.run(command, capture_output=True, text=True)
            made = sorted(Path(scratch).glob("*.csv"))
            if done.returncode not in (0, 1) or len(made) != 1:  # 1: rows made, some failing: judged as any
                tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
                raise ValueError(f"the {name} leg's draws did not run with {self.taken[name]} (exit "
                                 f"{done.returncode}): {tail}")
            rows = read_results(made[0])
        kept = self.settings.out / f"{name}.draws.csv"
        pooled = pd.concat([read_results(kept), rows], ignore_index=True) if kept.exists() else rows
        write_csv(pooled, kept)
        self.say(f"{name}: {len(rows)} rows of the new draws kept in {kept} (give it as a further --baseline-rows "
                 f"to pool them in a later run)")
        return rows

    def undrawn_lines(self) -> list[str]:
        """For each leg whose rows were taken and lack draws a gate needed: the command that makes them on that
        leg's stack (the ids in ``OUT/<leg>.undrawn.txt``) and how to pool them."""
        lines = []
        for name, cases in self.undrawn.items():
            listed = self.settings.out / f"{name}.undrawn.txt"
            atomic_write_text(listed, "".join(f"{case_id}\n" for case_id in cases))
            lines += [f"gate: {len(cases)} draws would decide comparisons that stay inconclusive, and the {name} "
                      f"rows given lack them. On the {name} leg's stack:",
                      f"  parity run --backend {name} $(sed 's/^/--case /' {listed}) --out DIR",
                      f"then this command again with one more --baseline-rows DIR/<its {name} file> (the rows are "
                      f"pooled), or with --baseline-python <that stack's python> to have them made there"]
        return lines

    def causality(self, name: str, cases: list[Case] | None = None) -> pd.DataFrame:
        """The causality and isolation check of leg ``name`` (one short case per op and variant of ``cases``)
        into ``causality-<leg>.csv``."""
        cases = self.cases if cases is None else cases
        path = self.result_path(name, prefix="causality-")
        chosen = causality_cases(cases)
        t0 = time.perf_counter()
        options = self.settings.legs.for_leg(name)
        if "compile_targets" in options:  # a perturbed run has the case's own shapes: the leg run compiles them once
            options["compile_targets"] = ()
        # no golden is compared: an in-memory reference cache that stays empty
        runner, options = self.runner(name, options, reference_cache=ReferenceCache(None), suite=False)
        leg_cache = runner.leg_cache
        rows = []
        self.workers.run(runner, options, chosen, on_case=lambda case, case_rows: rows.extend(case_rows),
                         task="causality", progress=self._progress(f"{name} causality"))
        df = causality_frame(rows)
        path = write_check_file(df, path, name, force=self.settings.force)
        bad = df[df["status"].isin(CAUSALITY_FAILING)]
        exact = int(df["bit_exact"].sum())
        self.say(f"{name} causality: {len(chosen)} cases in {time.perf_counter() - t0:.1f} s, {exact}/{len(df)} "
                 f"bit-exact, {len(bad)} failing -> {path}")
        if leg_cache is not None:
            self.say(f"{name} causality: "
                     f"{leg_cache.summary(leg_cache.hits, leg_cache.hits + leg_cache.misses, 'runs')}")
        for r in bad.to_dict("records"):
            self.say(f"  {r['status'].upper()} {r['case_id']} {r['tensor']}: {r['reason']}")
        return df

    def gate(self, base: str, candidate: str, gate: GateSettings, options: dict | None = None) -> GateResult:
        """The gate of ``candidate``'s rows against ``base``'s under ``gate`` (``options``: the gate's keywords,
        default ``gate.options(candidate)``), and the draws that decide its inconclusive comparisons: run on both
        legs and folded into their result files (so ``parity gate`` on the files gives the same verdict), a leg
        whose rows were taken (:meth:`take`) making its own where it runs, or saying how."""
        options = gate.options(candidate) if options is None else options
        return sequential_gate(_FoldedDraws(self, (base, candidate)), self.cases, gate.policy, options,
                               max_draws=gate.max_draws, say=self.say)

    def compile(self, runner: Runner, options: dict, cases: list[Case], targets: tuple[str, ...],
                on_case: Callable[[Case, list[dict]], None]) -> None:
        """``parity compile``'s walk: each case through the pool, compiled for ``targets``."""
        self.workers.run(runner, options, cases, on_case=on_case, task="compile", targets=targets,
                         progress=self._progress("compile"))


class _FoldedDraws:
    """The sequential test's evidence in a run: the two legs' rows, and more draws made by running each leg on
    those it lacks (into a scratch file, then folded into the leg's result file)."""

    def __init__(self, run: Run, legs: tuple[str, str]):
        self.run, self.legs = run, legs

    def rows(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        return self.run.frames[self.legs[0]], self.run.frames[self.legs[1]]

    def draw(self, cases: list[Case]) -> bool:
        run = self.run
        for name in self.legs:  # first the legs whose rows were made elsewhere: without their draws, none is run
            if name not in run.taken:
                continue
            have = set(run.frames[name]["case_id"])
            missing = [c for c in cases if c.id not in have]
            if not missing:
                continue
            if run.taken[name] is None:
                run.undrawn.setdefault(name, {}).update({c.id: c for c in missing})
                return False
            run.frames[name] = pd.concat([run.frames[name], run.draw_elsewhere(name, missing)], ignore_index=True)
        for name in self.legs:
            if name in run.taken:
                continue
            have = set(run.frames[name]["case_id"])
            missing = [c for c in cases if c.id not in have]
            if not missing:
                continue
            path = run.paths[name]
            extra = path.with_name(f"{path.stem}.redraws.csv")
            for scratch in (extra, extra.with_name(f"{extra.stem}.partial.csv")):  # parity all's own, from a crash
                scratch.unlink(missing_ok=True)
            rows = run.leg(name, missing, path=extra)
            run.frames[name] = pd.concat([run.frames[name], rows], ignore_index=True)
            with ResultFile(path, {"leg": name, "suite": run.settings.selection.suite_label}, force=True):
                write_csv(run.frames[name], path)
            extra.unlink()
            fold_tracebacks(extra, path)
            run.say(f"{name}: {len(rows)} rows of the new draws folded into {path}")
        return True


def gate_case(case: Case, run_rows, baseline, policy, candidate_leg: str,
              baseline_rows=None) -> tuple[GateResult, list[dict]]:
    """One case's gate as the pytest plugin runs it: the candidate's rows (``run_rows(case) -> rows``) against
    ``baseline``'s rows of the same draws. While a comparison is inconclusive and the baseline has the draws
    that would decide it (``baseline`` holds them, as ``pytest -m gpu --parity-draws N`` makes them, or
    ``baseline_rows(case) -> rows`` gives the ones it lacks), the candidate runs those draws too and the gate
    pools them (:func:`harness.judge.sequential.sequential_gate`, as ``parity all``). Returns the result and
    every row the candidate made."""
    evidence = _CaseDraws(case, run_rows, baseline, baseline_rows)
    result = sequential_gate(evidence, [case], policy, {"candidate_leg": candidate_leg})
    return result, evidence.made


class _CaseDraws:
    """The sequential test's evidence for one case in the pytest plugin: the candidate runs here, the baseline's
    draws come from its file (or ``baseline_rows``)."""

    def __init__(self, case: Case, run_rows, baseline: pd.DataFrame, baseline_rows=None):
        base_id = undrawn_id(case.id)
        self.run_rows, self.baseline_rows = run_rows, baseline_rows
        self.base = baseline[baseline["case_id"].map(undrawn_id) == base_id]
        self.made = list(run_rows(case))

    def rows(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        return self.base, rows_to_frame(self.made)

    def draw(self, cases: list[Case]) -> bool:
        have = set(self.base["case_id"])
        lacking = [d for d in cases if d.id not in have]
        if lacking and self.baseline_rows is not None:
            self.base = pd.concat([self.base] + [rows_to_frame(self.baseline_rows(d)) for d in lacking],
                                  ignore_index=True)
        if not {d.id for d in cases} <= set(self.base["case_id"]):
            return False  # the baseline lacks the draws: the result stays inconclusive and says which decide it
        for d in cases:
            self.made += self.run_rows(d)
        return True


# ------------------------------------------------------------------ report
def write_gate(result: GateResult, out_dir: Path) -> tuple[Path, Path]:
    """parity.csv, parity.md, parity.html and parity.png in ``out_dir``; parity.md is also appended to
    ``$GITHUB_STEP_SUMMARY`` when it is set. Returns (parity.csv, parity.md)."""
    out_dir = Path(out_dir)
    csv_path = write_csv(result.named_parity(), out_dir / "parity.csv")  # its columns named by the legs compared
    md = markdown(result)
    md_path = out_dir / "parity.md"
    atomic_write_text(md_path, md)
    write_html_report(result, out_dir)  # parity.html and parity.png, next to parity.md
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a") as f:  # GitHub's own file: append, never replace
            f.write(md)
    return csv_path, md_path


def report_gate(result: GateResult, out: Path, junit: Path | None = None, force: bool = False,
                say: Callable[[str], None] = print) -> None:
    """The gate's files (:func:`write_gate`, and JUnit XML at ``junit``) and what a terminal shows of it: the
    headline and counts, each failure with its repro (20 at most), and the inconclusive comparisons when
    nothing failed."""
    csv_path, md_path = write_gate(result, out)
    counts = result.parity.groupby("verdict").size().to_dict()
    say(f"gate: {result.headline} ({', '.join(f'{n} {v}' for v, n in sorted(counts.items()))})"
        f" -> {csv_path}, {md_path}, {md_path.with_suffix('.html')} (heatmap: {md_path.with_suffix('.png')})")
    from harness.report.reports import provenance_mismatch

    for clause in provenance_mismatch(result):
        say(f"gate: made apart: {clause}")
    if junit is not None:
        from harness.report.junit import write_junit

        say(f"gate: JUnit XML, one test case per (case, tensor) -> {write_junit(result, junit, force)}")
    for r in result.failures.to_dict("records")[:20]:
        say(f"  FAIL {r['case_id']} {r['tensor']} {r['metric']}: {r['reason']}\n       repro: {r['repro']}")
    if len(result.failures) > 20:
        say(f"  ... and {len(result.failures) - 20} more in {csv_path}")
    if result.failures.empty and not result.inconclusive.empty:
        for r in result.inconclusive.to_dict("records")[:20]:
            say(f"  INCONCLUSIVE {r['case_id']} {r['tensor']} {r['metric']}: {r['reason']}")
