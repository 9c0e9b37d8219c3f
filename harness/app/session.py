"""A run: one command's settings, its reference cache, its worker pool and the runners it builds, and the stages
that hand each other rows.

``parity all`` is :meth:`Run.all`, the sequence of stages (docs/architecture.md)::

    legs ──▶ causality ──▶ gate ──▶ draws (the sequential test) ──▶ report ──▶ peer tables

- :meth:`Run.leg`: one leg over the cases into its result file (appended case by case, resumable);
- :meth:`Run.causality`: the causality and isolation check of one leg;
- :meth:`Run.gate`: the gate of a candidate's rows against the baseline's, with the draws that decide its
  inconclusive comparisons (:func:`harness.judge.sequential.sequential_gate`), which the run makes and folds
  into both legs' result files;
- :meth:`Run.report_gate`: parity.csv, .md, .html, .png, JUnit XML, and the lines a terminal shows;
- :meth:`Run.peer_tables`: peers.csv and peers.md of the candidates gated against the baseline;
- :meth:`Run.compile`: ``parity compile``'s walk of the cases through the pool.

Each verb's method returns an :class:`Outcome`, which the command line turns into its exit status.
``parity run``, ``parity causality``, ``parity gate``, ``parity compile``, ``parity calibrate`` and ``parity all``
each make one :class:`Run` from their settings (:mod:`harness.app.settings`); each leg's runner is
built from its recipe (:class:`harness.run.recipe.LegRecipe`), resolved once per run, as the pytest plugin's are."""

from __future__ import annotations

import dataclasses
import enum
import sys
import time
from pathlib import Path
from typing import Callable

import pandas as pd

from cases.case import Case
from harness.app.settings import GateSettings, RunSettings
from harness.app.workers import Workers
from harness.core.results import atomic_write_text, rows_to_frame, summarize, write_csv
from harness.core.status import CAUSALITY_FAILING, FAILING, Status
from harness.judge.baseline import rows_made_elsewhere
from harness.judge.gate import GateResult, undrawn_id
from harness.judge.sequential import sequential_gate
from harness.probes.causality import causality_cases, causality_frame
from harness.report.html_report import write_html_report
from harness.report.reports import markdown
from harness.run.recipe import LegRecipe
from harness.run.reference_cache import ReferenceCache
from harness.run.result_file import ResultFile, fold_tracebacks, write_check_file
from harness.run.runner import Runner


class Outcome(enum.IntEnum):
    """How a verb ended, ordered by :data:`SEVERITY` (its value is the command line's exit status)."""

    PASS = 0
    FAIL = 1  # a parity or bound violation, or an error row
    INCONCLUSIVE = 3  # the gate's draws did not decide a comparison: never a pass
    LOST = 4  # a case's process exited, crashed or ran past its time limit: the run is not whole

    def __or__(self, other: "Outcome") -> "Outcome":
        """Both outcomes together: lost cases outrank a failure (the verdicts lack them), which outranks an
        inconclusive gate, which outranks a pass."""
        return max(self, Outcome(other), key=SEVERITY.index)


SEVERITY = (Outcome.PASS, Outcome.INCONCLUSIVE, Outcome.FAIL, Outcome.LOST)


def gate_outcome(result: GateResult) -> Outcome:
    """A gate's outcome: FAIL on a failure, INCONCLUSIVE when nothing failed but a comparison is, else PASS."""
    if result.failures.empty and not result.inconclusive.empty:
        return Outcome.INCONCLUSIVE
    return Outcome.PASS if result.passed else Outcome.FAIL


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
        self.reference_cache = ReferenceCache(settings.cache_dir if settings.reference_cache else None)
        self.workers = Workers(settings.jobs)
        self.recipes: dict[str, LegRecipe] = {}  # each leg's recipe, resolved once
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
    def recipe(self, name: str) -> LegRecipe:
        """Leg ``name``'s recipe for this run (:class:`harness.run.recipe.LegRecipe`), resolved once: the
        settings' options for its role, the selection's suite, the caches, the case time limit."""
        if name not in self.recipes:
            s = self.settings
            directory = self.reference_cache.directory
            self.recipes[name] = LegRecipe.resolve(
                name, s.legs.for_leg(name), s.case_timeout, suite=s.selection.suite_label,
                reference_cache=directory, cache_dir=s.cache_dir, read_cache=s.read_leg_cache)
        return self.recipes[name]

    def runner(self, recipe: LegRecipe) -> Runner:
        """``recipe``'s runner in this process, over the run's reference cache where the recipe keeps its goldens
        there (so the legs of one run share the goldens computed in memory)."""
        return recipe.runner(self.reference_cache if recipe.task == "run" else None)

    def _progress(self, label: str) -> str | None:
        return label if self.settings.progress else None

    def result_path(self, name: str, prefix: str = "") -> Path:
        """Where leg ``name``'s rows of the selection go (``prefix``: ``causality-`` for its check file)."""
        return self.settings.out / (prefix + self.settings.selection.result_name(name, tag=self.settings.tag,
                                                                                  cases=self.cases))

    # ---------------------------------------------------------------- verbs
    def all(self, gate: GateSettings) -> Outcome:
        """``parity all``: every leg this machine can run (the baseline's rows taken from
        :attr:`RunSettings.baseline_rows` when given), each leg's causality check, then the gate of this
        project's candidate and of each further candidate against the baseline, with the draws that decide their
        inconclusive comparisons, and the peer table of the candidates."""
        from harness.legs.registry import BUILTIN, default_leg, leg_spec

        settings, out = self.settings, self.settings.out
        base, ours = default_leg("baseline"), default_leg("candidate")
        if settings.baseline_rows:  # made where fla runs: the baseline is not run here
            self.take_baseline_rows(base)
        legs = [*((spec.name, spec.missing()) for spec in BUILTIN),
                *((name, leg_spec(name).missing()) for name in settings.candidates)]
        outcome = self.legs_stage(legs)
        if base in self.frames and ours in self.frames:
            outcome |= self.report_gate(self.gate(base, ours, gate, gate.options()), out, gate)
        else:
            self.say(f"gate: skipped, it needs both the {base} and the {ours} legs"
                     + (f"; no {gate.junit} written" if gate.junit else ""))
        gated = [name for name in settings.candidates if name in self.frames and base in self.frames]
        for name in gated:
            self.say(f"gate of {name} (in {out / name}):")
            outcome |= self.report_gate(self.gate(base, name, gate), writable(out / name),  # no JUnit
                                        dataclasses.replace(gate, junit=None))
        if gated:
            self.peer_tables(base, [ours, *gated], gate)
        for line in self.undrawn_lines():
            self.say(line)
        return self.outcome(outcome)

    def legs_stage(self, legs: list[tuple[str, str | None]]) -> Outcome:
        """Each leg ``(name, why it cannot run here or None)`` over the cases, then its causality check (unless
        the settings say not); FAIL when a leg's or a check's rows fail."""
        outcome = Outcome.PASS
        for name, why_not in legs:
            if name in self.frames:  # its rows came from elsewhere (--baseline-rows)
                continue
            if why_not:
                self.say(f"{name}: skipped, {why_not}")
                continue
            if failing(self.leg(name)):
                outcome = Outcome.FAIL
            if self.settings.causality and causality_failing(self.causality(name)):
                outcome = Outcome.FAIL
        return outcome

    def run_leg(self, name: str) -> Outcome:
        """``parity run``: leg ``name`` over the cases."""
        return self.outcome(Outcome.FAIL if failing(self.leg(name)) else Outcome.PASS)

    def check_causality(self, name: str) -> Outcome:
        """``parity causality``: leg ``name``'s causality and isolation check."""
        return self.outcome(Outcome.FAIL if causality_failing(self.causality(name)) else Outcome.PASS)

    def gate_files(self, baseline: Path, candidate: Path, gate: GateSettings) -> Outcome:
        """``parity gate``: two result files judged under ``gate`` (its rows' filter, ``--allow-partial``), into
        the run's output folder."""
        from harness.judge.gate import gate_files

        self.reask_refusals(((baseline, gate.baseline_leg), (candidate, gate.candidate_leg)))
        result = gate_files(baseline, candidate, gate.policy, allow_partial=gate.allow_partial,
                            select=gate.row_filter(), **gate.options())
        return self.report_gate(result, self.settings.out, gate)

    def reask_refusals(self, files) -> None:
        """Each file's ``unsupported`` rows re-asked of its leg where the leg here made them
        (:mod:`harness.app.refusals`): a refusal the leg does not give is an edited row (a ValueError); a leg
        that cannot be asked is said in a line."""
        from harness.app.refusals import refusals_not_the_legs
        from harness.core.results import ReportError, read_table

        for path, leg in files:
            try:
                rows = read_table(path)
            except (ReportError, OSError):
                continue  # the gate names what is wrong with the file
            edited, note = refusals_not_the_legs(rows, leg, path)
            if edited:
                raise ValueError(edited[0] + (f" ({len(edited) - 1} more such case(s))" if len(edited) > 1 else ""))
            if note:
                self.say(f"gate: {note}")

    def outcome(self, outcome: Outcome) -> Outcome:
        """``outcome``, or :attr:`Outcome.LOST` with a line naming the cases whose process ended without their
        rows."""
        lost = self.workers.lost
        if not lost:
            return outcome
        print(f"parity: {len(lost)} case(s) lost, their process exited, crashed or ran past its time limit (first: "
              f"{lost[0]}); their error rows say how; exit {int(Outcome.LOST)}", file=sys.stderr)
        return outcome | Outcome.LOST

    def compile_record(self, backend: str, targets: tuple[str, ...], reuse: tuple[Path, ...] = ()) -> Outcome:
        """``parity compile``: each case of candidate ``backend`` compiled for ``targets`` (the rows of a record in
        ``reuse`` whose content key still holds are taken from it) into ``compile[.<leg>].csv``."""
        from harness.compile.tpu_compile import versions
        from harness.legs.registry import default_leg, leg_spec
        from harness.probes.compile_cases import RecordError, compile_frame, read_record, reused_rows
        from harness.report.compile_lines import compile_seconds, mxu_summary

        cases = self.cases
        try:
            record = read_record(reuse)
        except RecordError as exc:
            raise ValueError(str(exc)) from None
        v = versions()
        self.say(f"compile: {len(cases)} cases x {', '.join(targets)} with jax {v['jax']}, libtpu {v['libtpu']}")
        if leg_spec(backend).role != "candidate":
            raise ValueError(f"--backend {backend} is the {leg_spec(backend).role} leg; compile a candidate")
        # its steps up to the run, nothing more: no real-TPU compile of its own, no golden, no cache, no suite column
        recipe = dataclasses.replace(self.recipe(backend), options=(("compile_targets", ()),), suite="",
                                     reference_cache=None, leg_cache=False, task="compile", targets=targets)
        runner = self.runner(recipe)
        if getattr(runner.leg, "gpu_only", False):
            raise ValueError(f"--backend {backend} declares platform 'gpu': its kernels are not compiled for TPU "
                             f"targets (docs/legs.md, A GPU implementation)")
        t0 = time.perf_counter()
        settled = {case.id: reused_rows(case, targets, runner, record) for case in cases}
        todo = [case for case in cases if settled[case.id] is None]
        if reuse:
            self.say(f"compile: {len(cases) - len(todo)} of {len(cases)} cases reused from "
                     f"{', '.join(map(str, reuse))} (the content key of every target's row unchanged: sources, "
                     f"versions, case), {len(todo)} to compile")
        self.compile(runner, recipe, todo, on_case=lambda case, compiled: settled.update({case.id: compiled}))
        rows = [row for case in cases for row in settled[case.id]]
        df = compile_frame(rows)
        host = getattr(runner.leg, "compile_note", "")
        if host:  # the runtime answered as a TPU host's while the library's program was traced
            df["program"] = df["program"].where(df["program"].isna(), df["program"].astype(str) + f"; {host}")
        stem = "compile" if backend == default_leg("candidate") else f"compile.{backend}"
        tag = self.settings.tag
        path = write_csv(df, self.settings.out / (f"{stem}.{tag}.csv" if tag else f"{stem}.csv"))
        self.say(f"compile: {len(df)} rows in {time.perf_counter() - t0:.1f} s -> {path}")
        for target, part in df.groupby("target", sort=False):
            ok = part[part["status"] == Status.OK]
            counts = ", ".join(f"{n} {s}" for s, n in sorted(part.groupby("status").size().to_dict().items()))
            kernels = (f"{int(part['kernels_mosaic'].sum())} of {int(part['kernels_traced'].sum())} kernels compiled "
                       "by Mosaic as their library built them")
            hbm = f"; largest HBM footprint {ok['hbm_bytes'].max() / 2**20:.1f} MiB" if len(ok) else ""
            self.say(f"  {target}: {counts}; {compile_seconds(part)}; {kernels}{hbm}")
            self.say(f"    MXU passes read from Mosaic: {mxu_summary(part)}")
        bad = df[df["status"] == Status.ERROR]
        for r in bad.to_dict("records")[:20]:
            self.say(f"  ERROR {r['case_id']} [{r['target']}]: {r['reason']}\n       repro: {r['repro']}")
        if len(bad) > 20:
            self.say(f"  ... and {len(bad) - 20} more in {path}")
        return self.outcome(Outcome.FAIL if len(bad) else Outcome.PASS)

    def calibrate(self, policy, results: tuple[Path, ...] = ()) -> Outcome:
        """``parity calibrate``: the noise of the clean baseline and candidate legs (their rows in ``results``, or
        run here over the cases) under ``policy``, and the policy derived from it, into the output folder."""
        from harness.core.metrics import METRICS
        from harness.core.results import column_values, provenance_line, read_results
        from harness.judge.calibrate import calibration_table, derive_policy, markdown, summary
        from harness.legs.registry import default_leg, leg_spec

        out = self.settings.out
        pair = default_leg("baseline"), default_leg("candidate")  # the clean kernels whose noise is calibrated
        if results:
            baseline, candidate = (read_results(p) for p in results)
        else:
            missing = [f"{leg}: {leg_spec(leg).missing()}" for leg in pair if leg_spec(leg).missing()]
            if missing:
                raise ValueError(f"calibration runs the {' and '.join(pair)} legs: {'; '.join(missing)}")
            baseline, candidate = (self.leg(leg) for leg in pair)
        table = calibration_table(baseline, candidate, policy)
        total = summary(table)
        derived = derive_policy(table, policy)
        provenance = f"- {pair[0]}: {provenance_line(baseline)}\n- {pair[1]}: {provenance_line(candidate)}"
        csv_path = write_csv(table, out / "calibration.csv")
        atomic_write_text(out / "calibration.md", markdown(table, policy, provenance, derived))
        facts = {"suite": ", ".join(column_values(candidate, "suite")), "draws": int(candidate["draw"].max()) + 1,
                 pair[0]: provenance_line(baseline), pair[1]: provenance_line(candidate),
                 "base_policy": policy.describe(),
                 "gated_comparisons": total["n"], "false_alarms_of_base_policy": total["false_alarms"]}
        atomic_write_text(out / "policy.toml", derived.to_toml(
            "Written by `parity calibrate` (harness/judge/calibrate.py): margins derived from the noise band of clean\n"
            "kernels, see calibration.md next to this file. Load it with --policy, or ship it as harness/policy.toml.",
            facts))
        self.say(f"calibration: {total['false_alarms']} false alarm(s) in {total['n']} gated comparisons "
              f"(rate {total['rate']:.3g}) -> {csv_path}, {out / 'calibration.md'}")
        for r in table[table["gated"] & (table["false_alarms"] > 0)].to_dict("records")[:20]:
            self.say(f"  {r['op']} {r['dtype']} {r['tensor']} {r['metric']}: {r['false_alarms']}/{r['n']} "
                  f"(ratio {r['ratio_min']:.3f}..{r['ratio_max']:.3f})")
        self.say(f"derived policy -> {out / 'policy.toml'}: " + ", ".join(f"{m} {derived.margin(m):g}" for m in METRICS)
              + f", {len(derived.rules)} wider where the noise was larger")
        return Outcome.FAIL if total["false_alarms"] else Outcome.PASS

    # ------------------------------------------------------------------ report
    def report_gate(self, result: GateResult, out: Path, gate: GateSettings | None = None) -> Outcome:
        """The gate's files (:func:`write_gate`; JUnit XML where ``gate`` says) and what a terminal shows of it:
        the headline and counts, each failure with its repro (20 at most), and the inconclusive comparisons when
        nothing failed. Returns the gate's outcome."""
        gate = gate or GateSettings()
        say = self.say
        csv_path, md_path = write_gate(result, out, gate.step_summary)
        counts = result.parity.groupby("verdict").size().to_dict()
        say(f"gate: {result.headline} ({', '.join(f'{n} {v}' for v, n in sorted(counts.items()))})"
            f" -> {csv_path}, {md_path}, {md_path.with_suffix('.html')} (heatmap: {md_path.with_suffix('.png')})")
        from harness.report.reports import provenance_mismatch

        for clause in provenance_mismatch(result):
            say(f"gate: made apart: {clause}")
        if gate.junit is not None:
            from harness.report.junit import write_junit

            say(f"gate: JUnit XML, one test case per (case, tensor) -> {write_junit(result, gate.junit, gate.force)}")
        for r in result.failures.to_dict("records")[:20]:
            say(f"  FAIL {r['case_id']} {r['tensor']} {r['metric']}: {r['reason']}\n       repro: {r['repro']}")
        if len(result.failures) > 20:
            say(f"  ... and {len(result.failures) - 20} more in {csv_path}")
        if result.failures.empty and not result.inconclusive.empty:
            for r in result.inconclusive.to_dict("records")[:20]:
                say(f"  INCONCLUSIVE {r['case_id']} {r['tensor']} {r['metric']}: {r['reason']}")
        return gate_outcome(result)

    def peer_tables(self, base: str, candidates: list[str], gate: GateSettings) -> None:
        """peers.csv and peers.md in the output folder: each candidate's forward tensors against ``base``'s."""
        from harness.report.peer_report import peer_markdown, peer_table

        out = self.settings.out
        table = peer_table(self.frames[base], [self.frames[n] for n in candidates if n in self.frames], gate.policy)
        write_csv(table, out / "peers.csv")
        atomic_write_text(out / "peers.md",
                          peer_markdown(table, f"Candidates against fla: {', '.join(candidates[1:])}"))
        self.say(f"peers: {len(table)} rows (case x forward tensor x candidate) -> {out / 'peers.csv'}, "
                 f"{out / 'peers.md'}")

    # ----------------------------------------------------------------- stages
    def leg(self, name: str, cases: list[Case] | None = None, path: Path | None = None) -> pd.DataFrame:
        """Leg ``name`` over ``cases`` (default: the selection) into its result file, or into ``path`` (a
        scratch file of the sequential test's draws, never resumed); the rows are kept in :attr:`frames`
        (replacing a leg's earlier rows when ``path`` is not given). Ctrl-C raises :class:`Interrupted`."""
        cases = self.cases if cases is None else cases
        recipe = self.recipe(name)
        runner = self.runner(recipe)
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
                self.workers.run(runner, recipe, todo, on_case=lambda case, rows: out.append(rows),
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

    def take_baseline_rows(self, base: str) -> None:
        """The baseline's rows of the selected cases from :attr:`RunSettings.baseline_rows`
        (:func:`harness.judge.baseline.rows_made_elsewhere`), taken as leg ``base``'s (:meth:`take`), their
        missing draws made by :attr:`RunSettings.baseline_python`."""
        paths = self.settings.baseline_rows
        rows = rows_made_elsewhere(paths, base, [c.id for c in self.cases])
        self.take(base, paths[0], rows, python=self.settings.baseline_python)
        count, draws = rows["case_id"].map(undrawn_id).nunique(), rows["case_id"].nunique()
        self.say(f"{base}: {count} cases' rows from {', '.join(map(str, paths))}"
                 + (f" ({draws} draws)" if draws != count else ""))

    def draw_elsewhere(self, name: str, cases: list[Case]) -> pd.DataFrame:
        """Leg ``name``'s rows of ``cases`` (draws a gate needs), made by its stack's Python (:meth:`take`) with
        this project's ``parity run`` there, kept in ``OUT/<leg>.draws.csv`` (pooled with earlier draws) and
        returned. A run that fails there is a ValueError with its last lines."""
        import subprocess
        import tempfile

        from harness.core.results import read_results

        with tempfile.TemporaryDirectory(dir=self.settings.out, prefix=f".{name}-draws-") as scratch:
            command = self.recipe(name).command_line(self.taken[name], [c.id for c in cases], Path(scratch),
                                                     jobs=self.settings.jobs)
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
        recipe = self.recipe(name)
        options = recipe.keywords
        if "compile_targets" in options:  # a perturbed run has the case's own shapes: the leg run compiles them once
            options["compile_targets"] = ()
        # no golden is compared: an in-memory reference cache that stays empty
        recipe = dataclasses.replace(recipe, options=tuple(options.items()), suite="", reference_cache=None,
                                     task="causality")
        runner = self.runner(recipe)
        leg_cache = runner.leg_cache
        rows = []
        self.workers.run(runner, recipe, chosen, on_case=lambda case, case_rows: rows.extend(case_rows),
                         progress=self._progress(f"{name} causality"))
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
        return sequential_gate(FoldedDraws(self, (base, candidate)), self.cases, gate.policy, options,
                               max_draws=gate.max_draws, say=self.say)

    def compile(self, runner: Runner, recipe: LegRecipe, cases: list[Case],
                on_case: Callable[[Case, list[dict]], None]) -> None:
        """``parity compile``'s walk: each case through the pool, compiled for the recipe's targets."""
        self.workers.run(runner, recipe, cases, on_case=on_case, progress=self._progress("compile"))


class FoldedDraws:
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
def write_gate(result: GateResult, out_dir: Path, step_summary: Path | None = None) -> tuple[Path, Path]:
    """parity.csv, parity.md, parity.html and parity.png in ``out_dir``; parity.md is also appended to
    ``step_summary`` (``$GITHUB_STEP_SUMMARY``, read by the front) when given. Returns (parity.csv, parity.md)."""
    out_dir = Path(out_dir)
    csv_path = write_csv(result.named_parity(), out_dir / "parity.csv")  # its columns named by the legs compared
    md = markdown(result)
    md_path = out_dir / "parity.md"
    atomic_write_text(md_path, md)
    write_html_report(result, out_dir)  # parity.html and parity.png, next to parity.md
    if step_summary:
        with open(step_summary, "a") as f:  # GitHub's own file: append, never replace
            f.write(md)
    return csv_path, md_path


def writable(path) -> Path:
    """The output directory, made and proven writable before any work (a bad --out must not cost a run); a
    ValueError with one line when it cannot be."""
    from harness.run.result_file import OutDirError, writable_dir

    try:
        return writable_dir(path)
    except OutDirError as exc:
        raise ValueError(str(exc)) from None
