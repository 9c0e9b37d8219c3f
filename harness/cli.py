"""``parity``: the front of the command line. Each verb turns its parsed arguments into settings records once
(:mod:`harness.app.settings`) and runs the stages of a run (:class:`harness.app.session.Run`); the options
themselves are declared in :mod:`harness.parser`.

Exit codes (docs/faults.md): 0 pass; 1 a parity or bound violation (or an error row); 2 usage or input error
(bad arguments, unwritable paths, unreadable, malformed or stale result files); 3 inconclusive (never a pass); 4
a case's process exited, crashed or ran past --case-timeout (its rows say how; the other cases ran); 130
interrupted by Ctrl-C or SIGTERM (the finished cases are kept: see --resume).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd

from harness.app.selection import Selection
from harness.app.session import Interrupted, Run, causality_failing, failing, report_gate
from harness.app.settings import GateSettings, LegOptions, RunSettings, check_file_size_limit, parse_case_timeout
from harness.app.workers import default_jobs, parse_jobs
from harness.core.status import Status
from harness.legs.registry import (BUILTIN, check_implementation, default_leg, leg_spec, parse_impl,
                                   register_implementation)
from harness.parser import DEFAULT_OUT, build_parser  # noqa: F401  (build_parser: the CI templates' test reads it)

EXIT_PASS, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
EXIT_INCONCLUSIVE = 3  # the gate's draws did not decide a comparison: never a pass
EXIT_LOST = 4  # a case's process exited, crashed or ran past --case-timeout: the run is not whole
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM, as the shell reports Ctrl-C
_SEVERITY = (EXIT_PASS, EXIT_INCONCLUSIVE, EXIT_FAIL, EXIT_LOST)


def _worse(a: int, b: int) -> int:
    """The exit status of two outcomes together: lost cases outrank a failure (the verdicts lack them), which
    outranks an inconclusive gate, which outranks a pass."""
    return max(a, b, key=_SEVERITY.index)


def _lost(run: Run, status: int) -> int:
    """``status``, or :data:`EXIT_LOST` with a line naming the cases whose process ended without their rows."""
    lost = run.workers.lost
    if not lost:
        return status
    print(f"parity: {len(lost)} case(s) lost, their process exited, crashed or ran past its time limit (first: "
          f"{lost[0]}); their error rows say how; exit {EXIT_LOST}", file=sys.stderr)
    return _worse(status, EXIT_LOST)


class UsageError(Exception):
    pass


# ------------------------------------------------------------ settings, once
def _selection(args) -> Selection:
    """The run's cases, as the pytest plugin selects them too (:class:`harness.app.selection.Selection`)."""
    return Selection(suite=getattr(args, "suite", "") or "", case_ids=tuple(getattr(args, "case", None) or ()),
                     cases_files=tuple(getattr(args, "cases_file", None) or ()), ops=tuple(getattr(args, "op", None) or ()),
                     draws=getattr(args, "draws", 1), shard=getattr(args, "shard", None))


def _select_cases(args) -> list:
    return _selection(args).cases()


def _jobs(args) -> int:
    return default_jobs() if args.jobs is None else parse_jobs(args.jobs)


def _run_settings(args) -> RunSettings:
    """``parity run``, ``causality``, ``calibrate`` and ``all``'s run, from their arguments."""
    legs = LegOptions.parse(args.tpu_targets, ref_method=args.ref_method, ref_dtype=args.ref_dtype,
                            dot_precision=args.dot_precision)
    return RunSettings(selection=_selection(args), out=Path(args.out), tag=args.tag, force=args.force,
                       resume=getattr(args, "resume", False), jobs=_jobs(args),
                       reference_cache=not args.no_ref_cache, read_leg_cache=not args.no_baseline_cache, legs=legs,
                       progress=not args.no_progress, case_timeout=parse_case_timeout(args.case_timeout))


def _policy(args):
    from harness.core.policy import policy_from_options

    return policy_from_options(args.policy, args.gate_metrics, args.margin, args.floor, args.alpha)


def _gate_settings(args) -> GateSettings:
    """``parity gate`` and ``all``'s gate, from their arguments: the policy loaded once, ``--junit`` checked
    before any work."""
    extra = {"max_draws": args.max_draws} if hasattr(args, "max_draws") else {}  # parity all's cap on draws
    return GateSettings(policy=_policy(args), baseline_leg=args.baseline_leg, candidate_leg=args.candidate_leg,
                        allow_missing=args.allow_missing, junit=_junit_target(args), force=args.force, **extra)


def _out_dir(path) -> Path:
    """The output directory, made and proven writable before any work (a bad --out must not cost a run)."""
    from harness.run.result_file import OutDirError, writable_dir

    try:
        return writable_dir(path)
    except OutDirError as exc:
        raise UsageError(str(exc)) from None


def _step_summary() -> None:
    """``$GITHUB_STEP_SUMMARY``, when set, must be a file the gate can append to: checked before any work."""
    import os

    value = os.environ.get("GITHUB_STEP_SUMMARY")
    if not value:
        return
    path = Path(value)
    if path.is_dir() or not os.access(path if path.exists() else path.parent, os.W_OK):
        raise UsageError(f"$GITHUB_STEP_SUMMARY={value} is not a file the gate can append to")


def _junit_target(args) -> Path | None:
    """``--junit FILE``, checked before any work: never over a file the gate did not write, unless --force."""
    if not args.junit:
        return None
    from harness.report.junit import check_junit_path

    return check_junit_path(args.junit, args.force)


def _gate_status(result) -> int:
    """A gate's exit status: 1 on a failure, 3 when nothing failed but a comparison is inconclusive, else 0."""
    if result.failures.empty and not result.inconclusive.empty:
        return EXIT_INCONCLUSIVE
    return EXIT_PASS if result.passed else EXIT_FAIL


def _report_gate(result, out: Path, gate: GateSettings | None = None) -> int:
    """The gate's files and lines (:func:`harness.app.session.report_gate`; JUnit XML only where ``gate`` says
    where), and its exit status."""
    report_gate(result, out, gate.junit if gate else None, gate.force if gate else False)
    return _gate_status(result)


# -------------------------------------------------------------------- verbs
def ptx_leg_inputs(leg: str, suite: str, case_ids) -> dict:
    """``parity ptx``'s view of the leg whose launches it records: the selected cases and what the leg's outputs
    on them depend on (:func:`harness.run.baseline_cache.leg_inputs`); ValueError for a bad selection."""
    from harness.run.baseline_cache import leg_inputs

    return leg_inputs(leg, Selection(suite="" if case_ids else suite, case_ids=tuple(case_ids)).cases())


def cmd_ptx(args) -> int:
    from harness.emulation import ptx

    return ptx.sweep(suite=args.suite, case=args.case, target=args.target, out=args.out, launches=args.launches,
                     reuse=args.reuse, backend=args.backend, leg_inputs=ptx_leg_inputs)


def cmd_mxu_probe(args) -> int:
    from harness.probes import mxu_probe

    return mxu_probe.probe(precision=args.precision, target=args.target, out=args.out)


def cmd_peers(args) -> int:
    """``reports/peers/README.md`` and ``index.html`` from every report's rows (harness.report.peer_table); ``--check``
    writes nothing and exits 1 when the page differs from what the rows give."""
    from pathlib import Path

    from harness.report.peer_table import HEAD, html_page, markdown, tables
    from harness.core.results import atomic_write_text

    root = Path(args.root)
    if not root.is_dir():
        raise UsageError(f"{root} is not a folder of reports (each a folder with gpu.csv[.gz] and candidates' rows)")
    try:
        t = tables(root, _policy(args), _native_rows(args))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    pages = {root / "README.md": markdown(t), root / "index.html": html_page(t)}
    if args.check:
        stale = [str(p) for p, text in pages.items() if not p.exists() or p.read_text() != text]
        print(f"peers: {', '.join(stale)} differ from the rows; run parity peers --root {root}" if stale
              else f"peers: {root}/README.md and index.html match the rows")
        return EXIT_FAIL if stale else EXIT_PASS
    title = HEAD.splitlines()[0]
    mine = root / "README.md"
    if mine.exists() and not mine.read_text().startswith(title) and not args.force:
        raise UsageError(f"{mine} was not written by parity peers; --force replaces it")
    for path, text in pages.items():
        atomic_write_text(path, text)
    print(f"peers: {len(t['ops'])} rows (op, variant, dtype, gate form) x {len(t['ops'].columns) - 4} candidates "
          f"-> {mine}, {root / 'index.html'}; judged against fla's "
          + ", ".join(f"{mode} rows on {n}" for mode, n in sorted(t["judged"].items())))
    return EXIT_PASS


def cmd_fidelity(args) -> int:
    """``parity fidelity``: :func:`harness.report.fidelity.measure` on the files, printed (and written with
    ``--out``); exit 1 with ``--check`` when a target is missed."""
    from harness.report import fidelity

    out = _out_dir(args.out) if args.out else None
    if out is not None:
        fidelity.check_out(out, args.force)
    result = fidelity.measure(args.files, args.candidate, _policy(args))
    print(fidelity.markdown(result), end="")
    if out is not None:
        print(f"fidelity: -> {', '.join(map(str, fidelity.write(result, out)))}")
    missed = len(result.missed)
    if args.check and missed:
        print(f"fidelity: {missed} path x dtype group(s) miss a target", file=sys.stderr)
        return EXIT_FAIL
    return EXIT_PASS


def _native_rows(args):
    """``parity peers``' native fla rows (``--native``; none with ``--no-native``): the default folder only where it
    exists, a folder named that does not exist is an error."""
    from harness.judge.baseline import DEFAULT_NATIVE_DIRS, native_rows

    if args.no_native:
        return None
    folders = [Path(p) for p in args.native] if args.native else [p for p in DEFAULT_NATIVE_DIRS if p.is_dir()]
    return native_rows(folders)


def cmd_cases(args) -> int:
    """One line per case: its id and compared tensors; with ``--inputs``, then one indented line per input a
    candidate binding's forward receives (name, shape, dtype). For your own cases (by id or file), a note on
    stderr where a kernel binding already refuses the case, so the refusal is seen when the case is made."""
    from harness.app import binding_inputs, case_from_id
    from harness.ops import get_op

    if args.explain:
        from harness.app.explain import explain

        for text in args.explain:
            case = case_from_id(text)
            print("\n".join(explain(case, get_op(case.op))))
        return EXIT_PASS
    selection = _selection(args)
    for case in selection.cases():
        op = get_op(case.op)
        print(f"{case.id}\t{','.join(op.tensor_names(case))}")
        if getattr(args, "inputs", False):
            call, received = binding_inputs(op, case)
            if call.id != case.id:
                print(f"  (a binding's first call is {call.id})")
            docs = {spec.name: spec.doc for spec in op.inputs(call)}
            for name, shape, dtype in received:
                print(f"  {name}\t[{', '.join(map(str, shape))}]\t{dtype}\t{docs.get(name) or ''}".rstrip())
        if selection.by_id:
            for binding, why in op.binding_refusals(case).items():
                print(f"parity cases: note: {case.id}: the {binding} binding refuses it, so the legs that run "
                      f"{binding} give unsupported rows: {why}", file=sys.stderr)
    return EXIT_PASS


def cmd_run(args) -> int:
    settings = _run_settings(args)
    with Run(settings) as run:
        run.cases  # a bad selection: before the output directory is made
        _out_dir(settings.out)
        df = run.leg(args.backend)
    return _lost(run, EXIT_FAIL if failing(df) else EXIT_PASS)


def cmd_causality(args) -> int:
    settings = _run_settings(args)
    with Run(settings) as run:
        run.cases
        _out_dir(settings.out)
        df = run.causality(args.backend)
    return _lost(run, EXIT_FAIL if causality_failing(df) else EXIT_PASS)


def cmd_gate(args) -> int:
    from harness.app.selection import result_in
    from harness.judge.gate import gate_files

    gate = _gate_settings(args)
    out = _out_dir(args.out)
    _step_summary()
    baseline = result_in(args.gpu_csv, gate.baseline_leg)
    candidate = result_in(args.tpu_csv, gate.candidate_leg)
    _reask_refusals(((baseline, gate.baseline_leg), (candidate, gate.candidate_leg)))
    result = gate_files(baseline, candidate, gate.policy, allow_partial=args.allow_partial, select=_gated(args),
                        **gate.options())
    return _report_gate(result, out, gate)


def _gated(args):
    """``parity gate``'s selection (``--suite``, ``--case``, ``--cases-file``, ``--op``) as a filter of a file's rows
    (the selected cases and their draws), or None: every row is judged."""
    from harness.judge.gate import of_cases

    ops = {o.strip() for text in args.op for o in text.split(",") if o.strip()}
    ids = ({c.id for c in Selection(suite=args.suite or "", case_ids=tuple(args.case),
                                    cases_files=tuple(args.cases_file)).cases()}
           if args.suite or args.case or args.cases_file else None)
    if ids is None and not ops:
        return None

    def select(rows: pd.DataFrame) -> pd.DataFrame:
        keep = pd.Series(True, index=rows.index)
        if ids is not None:
            keep &= of_cases(rows, ids)
        if ops:
            keep &= rows["op"].isin(ops)
        return rows[keep].reset_index(drop=True)
    return select


def _reask_refusals(files) -> None:
    """Each file's ``unsupported`` rows re-asked of its leg where the leg here made them
    (:mod:`harness.app.refusals`): a refusal the leg does not give is an edited row (exit 2); a leg that cannot be
    asked is said in a line."""
    from harness.app.refusals import refusals_not_the_legs
    from harness.core.results import ReportError, read_table

    for path, leg in files:
        try:
            rows = read_table(path)
        except (ReportError, OSError):
            continue  # the gate names what is wrong with the file
        edited, note = refusals_not_the_legs(rows, leg, path)
        if edited:
            raise UsageError(edited[0] + (f" ({len(edited) - 1} more such case(s))" if len(edited) > 1 else ""))
        if note:
            print(f"gate: {note}")


def cmd_compile(args) -> int:
    from harness.core.results import write_csv
    from harness.probes.compile_cases import RecordError, compile_frame, read_record, reused_rows
    from harness.compile.tpu_compile import COMPILE_DEFAULT_TARGETS, parse_targets, versions

    targets = parse_targets(args.target, COMPILE_DEFAULT_TARGETS)
    check_file_size_limit(targets)
    run = Run(RunSettings(selection=_selection(args), out=Path(args.out), tag=args.tag, jobs=_jobs(args),
                          progress=not args.no_progress, reference_cache=False,
                          case_timeout=parse_case_timeout(args.case_timeout)))
    cases = run.cases
    _out_dir(args.out)
    reuse = [Path(p) for text in args.reuse or () for p in text.split(",") if p.strip()]
    try:
        record = read_record(reuse)
    except RecordError as exc:
        raise UsageError(str(exc)) from None
    v = versions()
    print(f"compile: {len(cases)} cases x {', '.join(targets)} with jax {v['jax']}, libtpu {v['libtpu']}")
    if leg_spec(args.backend).role != "candidate":
        raise UsageError(f"--backend {args.backend} is the {leg_spec(args.backend).role} leg; compile a candidate")
    # its steps up to the run, nothing more: no real-TPU compile of its own, no golden, no cache, no suite column
    runner, options = run.runner(args.backend, {"compile_targets": ()}, suite=False, leg_cache=False)
    if getattr(runner.leg, "gpu_only", False):
        raise UsageError(f"--backend {args.backend} declares platform 'gpu': its kernels are not compiled for TPU "
                         f"targets (docs/legs.md, A GPU implementation)")
    t0 = time.perf_counter()
    settled = {case.id: reused_rows(case, targets, runner, record) for case in cases}
    todo = [case for case in cases if settled[case.id] is None]
    if reuse:
        print(f"compile: {len(cases) - len(todo)} of {len(cases)} cases reused from {', '.join(map(str, reuse))} "
              f"(the content key of every target's row unchanged: sources, versions, case), {len(todo)} to compile")
    with run:
        run.compile(runner, options, todo, targets, on_case=lambda case, compiled: settled.update({case.id: compiled}))
    rows = [row for case in cases for row in settled[case.id]]
    df = compile_frame(rows)
    host = getattr(runner.leg, "compile_note", "")
    if host:  # the runtime answered as a TPU host's while the library's program was traced
        df["program"] = df["program"].where(df["program"].isna(), df["program"].astype(str) + f"; {host}")
    stem = "compile" if args.backend == default_leg("candidate") else f"compile.{args.backend}"
    path = write_csv(df, Path(args.out) / (f"{stem}.{args.tag}.csv" if args.tag else f"{stem}.csv"))
    print(f"compile: {len(df)} rows in {time.perf_counter() - t0:.1f} s -> {path}")
    for target, part in df.groupby("target", sort=False):
        ok = part[part["status"] == Status.OK]
        counts = ", ".join(f"{n} {s}" for s, n in sorted(part.groupby("status").size().to_dict().items()))
        kernels = (f"{int(part['kernels_mosaic'].sum())} of {int(part['kernels_traced'].sum())} kernels compiled "
                   "by Mosaic as their library built them")
        hbm = f"; largest HBM footprint {ok['hbm_bytes'].max() / 2**20:.1f} MiB" if len(ok) else ""
        print(f"  {target}: {counts}; {_compile_seconds(part)}; {kernels}{hbm}")
        print(f"    MXU passes read from Mosaic: {_mxu_summary(part)}")
    bad = df[df["status"] == Status.ERROR]
    for r in bad.to_dict("records")[:20]:
        print(f"  ERROR {r['case_id']} [{r['target']}]: {r['reason']}\n       repro: {r['repro']}")
    if len(bad) > 20:
        print(f"  ... and {len(bad) - 20} more in {path}")
    return _lost(run, EXIT_FAIL if len(bad) else EXIT_PASS)


def _compile_seconds(part) -> str:
    """The time the target's rows took to compile, every status's (a failed compile took its time too); rows
    reused from a record took none here."""
    reused = part["reused_from"].notna() if "reused_from" in part else part["compile_s"].isna()
    text = f"{part.loc[~reused, 'compile_s'].sum():.1f} s compiling"
    return text + (f" ({int(reused.sum())} rows reused)" if reused.any() else "")


def _mxu_summary(part) -> str:
    """The compile rows' MXU check in one line: dots verified, mismatches, and why any were unverified."""
    from harness.compile.mosaic_dump import MISMATCH, UNVERIFIED, VERIFIED

    check = part["mxu_check"].fillna("").astype(str)
    verified = part[check == VERIFIED]
    text = (f"{len(verified)} cases verified ({int(verified['mxu_dots'].sum())} dots, "
            f"{int(verified['mxu_passes_mosaic'].sum())} passes as modeled)")
    mismatched = int((check == MISMATCH).sum())
    unverified = check[check.str.startswith(UNVERIFIED)]
    if mismatched:
        text += f", {mismatched} MISMATCH (error rows)"
    if len(unverified):
        text += f", {len(unverified)} UNVERIFIED ({unverified.iloc[0]})"
    return text


def cmd_merge(args) -> int:
    from harness.core.results import merge_results, write_csv

    output, inputs = Path(args.output), [Path(p) for p in args.inputs]
    for p in inputs:
        if p.resolve() == output.resolve() or (output.exists() and p.exists() and p.samefile(output)):
            raise UsageError(f"-o {output} is one of the inputs; merge never overwrites an input")
    if output.is_dir():
        raise UsageError(f"-o {output} is a directory; name the merged CSV")
    if output.exists() and not args.force:
        raise UsageError(f"-o {output} exists; pass --force to overwrite it")
    _out_dir(output.parent)
    df = merge_results(inputs, allow_mixed=args.allow_mixed)
    print(f"merged {len(inputs)} files, {len(df)} rows -> {write_csv(df, output)}")
    return EXIT_PASS


def cmd_calibrate(args) -> int:
    from harness.judge.calibrate import calibration_table, derive_policy, markdown, summary
    from harness.core.metrics import METRICS
    from harness.core.results import atomic_write_text, column_values, provenance_line, read_results, write_csv

    policy = _policy(args)
    out = _out_dir(args.out)
    pair = default_leg("baseline"), default_leg("candidate")  # the clean kernels whose noise is calibrated
    if args.results:
        gpu, tpu = (read_results(Path(p)) for p in args.results)
    else:
        cases = _select_cases(args)
        missing = [f"{leg}: {why}" for leg, why in available_legs().items() if leg in pair and why]
        if missing:
            raise UsageError(f"calibration runs the {' and '.join(pair)} legs: {'; '.join(missing)}")
        with Run(_run_settings(args)) as run:
            gpu, tpu = (run.leg(leg, cases) for leg in pair)
    table = calibration_table(gpu, tpu, policy)
    total = summary(table)
    derived = derive_policy(table, policy)
    provenance = f"- {pair[0]}: {provenance_line(gpu)}\n- {pair[1]}: {provenance_line(tpu)}"
    csv_path = write_csv(table, out / "calibration.csv")
    atomic_write_text(out / "calibration.md", markdown(table, policy, provenance, derived))
    facts = {"suite": ", ".join(column_values(tpu, "suite")), "draws": int(tpu["draw"].max()) + 1,
             pair[0]: provenance_line(gpu), pair[1]: provenance_line(tpu), "base_policy": policy.describe(),
             "gated_comparisons": total["n"], "false_alarms_of_base_policy": total["false_alarms"]}
    atomic_write_text(out / "policy.toml", derived.to_toml(
        "Written by `parity calibrate` (harness/judge/calibrate.py): margins derived from the noise band of clean\n"
        "kernels, see calibration.md next to this file. Load it with --policy, or ship it as harness/policy.toml.",
        facts))
    print(f"calibration: {total['false_alarms']} false alarm(s) in {total['n']} gated comparisons "
          f"(rate {total['rate']:.3g}) -> {csv_path}, {out / 'calibration.md'}")
    for r in table[table["gated"] & (table["false_alarms"] > 0)].to_dict("records")[:20]:
        print(f"  {r['op']} {r['dtype']} {r['tensor']} {r['metric']}: {r['false_alarms']}/{r['n']} "
              f"(ratio {r['ratio_min']:.3f}..{r['ratio_max']:.3f})")
    print(f"derived policy -> {out / 'policy.toml'}: " + ", ".join(f"{m} {derived.margin(m):g}" for m in METRICS)
          + f", {len(derived.rules)} wider where the noise was larger")
    return EXIT_FAIL if total["false_alarms"] else EXIT_PASS


def available_legs() -> dict[str, str | None]:
    """Each built-in leg -> None if its framework imports here, else why it cannot run."""
    return {spec.name: spec.missing() for spec in BUILTIN}


def _baseline_rows(paths: list[Path], base: str, cases) -> pd.DataFrame:
    """The baseline leg's rows of the selected cases and of their further draws, pooled from result files made on
    another machine (exit 2 when a file is not the baseline's or the files lack a selected case). A (case draw,
    tensor) in several files is taken from the first."""
    from harness.core.results import read_results
    from harness.judge.gate import of_cases

    frames = []
    for path in paths:
        rows = read_results(path)
        legs = sorted(rows["leg"].dropna().unique())
        if legs != [base]:
            raise UsageError(f"--baseline-rows {path} holds rows of {', '.join(legs) or 'no leg'}, not of the {base} "
                             f"leg")
        frames.append(rows)
    rows = pd.concat(frames, ignore_index=True).drop_duplicates(["case_id", "tensor"])
    wanted = [c.id for c in cases]
    missing = [i for i in wanted if i not in set(rows["case_id"])]
    if missing:
        named = " ".join(map(str, paths))
        raise UsageError(f"--baseline-rows {named} lacks {len(missing)} of the {len(wanted)} selected cases (first: "
                         f"{missing[0]}); make them where fla runs: parity run --backend {base} with the same "
                         "selection")
    return rows[of_cases(rows, wanted)].reset_index(drop=True)


def _candidates(args) -> list[str]:
    """``--candidate`` legs, each a registered candidate that loads here (checked before any work)."""
    for name in args.candidate:
        if leg_spec(name).role != "candidate":
            raise UsageError(f"--candidate {name} is the {leg_spec(name).role} leg, not a candidate")
        check_implementation(name)
    return list(args.candidate)


def cmd_all(args) -> int:
    """legs -> causality -> gate -> draws -> report: every leg this machine can run, each leg's causality check,
    then the gate of this project's candidate and of each ``--candidate`` against the baseline, with the draws
    that decide their inconclusive comparisons, and the peer table of the candidates."""
    from harness.judge.gate import undrawn_id

    gate = _gate_settings(args)
    extra = _candidates(args)
    settings = _run_settings(args)
    base, ours = default_leg("baseline"), default_leg("candidate")
    with Run(settings) as run:
        cases = run.cases
        out = _out_dir(settings.out)
        _step_summary()
        if args.baseline_python and not args.baseline_rows:
            raise UsageError("--baseline-python makes the baseline's missing draws for --baseline-rows: give the "
                             "baseline's rows too")
        if args.baseline_rows:  # made where fla runs: the baseline is not run here
            rows = _baseline_rows(args.baseline_rows, base, cases)
            run.take(base, args.baseline_rows[0], rows, python=args.baseline_python)
            count, draws = rows["case_id"].map(undrawn_id).nunique(), rows["case_id"].nunique()
            print(f"{base}: {count} cases' rows from {', '.join(map(str, args.baseline_rows))}"
                  + (f" ({draws} draws)" if draws != count else ""))
        status = _legs_stage(run, [*available_legs().items(), *((n, leg_spec(n).missing()) for n in extra)],
                             causality=not args.no_causality)
        if base in run.frames and ours in run.frames:
            status = _worse(status, _report_gate(run.gate(base, ours, gate, gate.options()), out, gate))
        else:
            print(f"gate: skipped, it needs both the {base} and the {ours} legs"
                  + (f"; no {gate.junit} written" if gate.junit else ""))
        gated = [name for name in extra if name in run.frames and base in run.frames]
        for name in gated:
            print(f"gate of {name} (in {out / name}):")
            status = _worse(status, _report_gate(run.gate(base, name, gate), _out_dir(out / name)))  # no JUnit
        if gated:
            _peer_tables(run, base, [ours, *gated], gate, out)
        for line in run.undrawn_lines():
            print(line)
    return _lost(run, status)


def _legs_stage(run: Run, legs, causality: bool) -> int:
    """Each leg that can run here over the cases, then its causality check; the exit status so far."""
    status = EXIT_PASS
    for name, why_not in legs:
        if name in run.frames:  # its rows came from elsewhere (--baseline-rows)
            continue
        if why_not:
            print(f"{name}: skipped, {why_not}")
            continue
        if failing(run.leg(name)):
            status = EXIT_FAIL
        if causality and causality_failing(run.causality(name)):
            status = EXIT_FAIL
    return status


def _peer_tables(run: Run, base: str, candidates: list[str], gate: GateSettings, out: Path) -> None:
    from harness.core.results import atomic_write_text, write_csv
    from harness.report.peer_report import peer_markdown, peer_table

    table = peer_table(run.frames[base], [run.frames[n] for n in candidates if n in run.frames], gate.policy)
    write_csv(table, out / "peers.csv")
    atomic_write_text(out / "peers.md", peer_markdown(table, f"Candidates against fla: {', '.join(candidates[1:])}"))
    print(f"peers: {len(table)} rows (case x forward tensor x candidate) -> {out / 'peers.csv'}, {out / 'peers.md'}")


def cmd_bisect(args) -> int:
    """``parity bisect``: the versions resolved (PyPI's dates read now and stored), the baseline's rows made or
    taken once, then :func:`harness.bisect.run.bisect` (docs/bisect.md)."""
    import json
    import os

    from harness.bisect.envs import LegInProcess, UvInstaller
    from harness.bisect.history import BisectSettings, History
    from harness.bisect.run import bisect, read_log
    from harness.bisect.versions import declared_refusal, git_versions, pypi_versions
    from harness.core.results import read_results, write_csv
    from harness.judge.gate import of_cases
    from harness.legs.registry import load_implementation

    argv = getattr(args, "argv", None)
    if args.replay:
        logged, marks = read_log(Path(args.replay).read_text(encoding="utf-8"))
        again = build_parser().parse_args(["bisect", *logged])
        again.replay, again.argv = None, logged
        again.good, again.bad = marks["good"] or again.good, marks["bad"] or again.bad
        again.skip = list(dict.fromkeys([*again.skip, *marks["skip"]]))
        for text in again.impl:
            register_implementation(*parse_impl(text))
        return cmd_bisect(again)
    if not args.candidate:
        raise UsageError("give the leg to bisect: --candidate LEG (or --replay LOG)")
    if leg_spec(args.candidate).role not in ("candidate", "baseline"):  # the baseline: its own history, against
        raise UsageError(f"--candidate {args.candidate} is the {leg_spec(args.candidate).role} leg: bisect a "
                         f"candidate, or the baseline leg against its own rows")
    if bool(args.versions) == bool(args.git):
        raise UsageError("give the versions: --versions SPEC (PyPI releases) or --git DIR --commits A..B")
    if bool(args.git) != bool(args.commits):
        raise UsageError("--git DIR and --commits A..B go together")
    target = getattr(leg_spec(args.candidate).build, "target", None)
    impl = load_implementation(args.candidate, target) if target else None
    notes = []
    if args.versions:
        package, versions, notes = pypi_versions(args.versions)
        refusal = declared_refusal(getattr(impl, "version_refusals", ()))
    else:
        versions = git_versions(Path(args.git), args.commits)
        package, refusal = Path(args.git).resolve().name, declared_refusal(())
    out = _out_dir(args.out or Path("reports/bisect") / args.candidate)
    record = out / "bisect.json"
    if record.exists() and not args.force:
        earlier = json.loads(record.read_text())
        if (earlier.get("leg"), earlier.get("package")) != (args.candidate, package):
            raise UsageError(f"{out} holds the bisection of {earlier.get('leg')} ({earlier.get('package')}); give "
                             f"another --out, or --force to write beside it")
    elif not record.exists() and any(out.glob("history.*")) and not args.force:
        raise UsageError(f"{out} holds history files no parity bisect wrote there: give another --out, or --force")
    if argv is None:
        argv = sys.argv[2:] if len(sys.argv) > 2 and sys.argv[1] == "bisect" else []
    settings = BisectSettings(leg=args.candidate, package=package, versions=tuple(versions), out=out,
                              policy=_policy(args), baseline_leg=default_leg("baseline"), sweep=args.sweep,
                              good=args.good, bad=args.bad, skip=tuple(args.skip), argv=tuple(argv),
                              notes=tuple(notes))
    cases = _select_cases(args)
    ids = [c.id for c in cases]
    options = (*(("--tpu-targets", args.tpu_targets) if args.tpu_targets else ()),
               *(("--case-timeout", args.case_timeout) if args.case_timeout else ()))
    base = default_leg("baseline")
    if args.baseline_rows:
        baseline = _baseline_rows([Path(p) for p in args.baseline_rows], base, cases)
        extra = tuple(a for p in args.baseline_rows for a in ("--baseline-rows", p))
    else:  # made once, here, and kept
        kept = out / "baseline" / "rows.csv"
        have = read_results(kept) if kept.exists() else None
        todo = ids if have is None else [i for i in ids if i not in set(have["case_id"])]
        if todo:
            print(f"bisect: the {base} leg over {len(todo)} cases, once -> {kept}")
            made = LegInProcess(base, options)(None, todo, out / "baseline" / "run")
            have = made if have is None else pd.concat([have, made], ignore_index=True)
            write_csv(have, kept)
        baseline = have[of_cases(have, ids)].reset_index(drop=True)
        extra = ("--baseline-rows", str(kept))
    cache = Path(args.cache or os.environ.get("PARITY_BISECT_CACHE")
                 or Path.home() / ".cache" / "linear-attn-parity" / "bisect")
    history = History(settings, ids, baseline, UvInstaller(cache, args.uv),
                      LegInProcess(args.candidate, options, impl=tuple(args.impl)), refusal)
    try:
        bisect(history, repro_extra=extra)
    except KeyboardInterrupt:
        raise Interrupted(f"bisect interrupted; every version's finished cases are kept under {out / 'versions'}: "
                          f"the same command continues without measuring them again") from None
    return 0


VERBS = {"bisect": cmd_bisect, "cases": cmd_cases, "run": cmd_run, "causality": cmd_causality, "gate": cmd_gate, "compile": cmd_compile,
         "peers": cmd_peers, "fidelity": cmd_fidelity,
         "merge": cmd_merge, "calibrate": cmd_calibrate, "all": cmd_all, "ptx": cmd_ptx,
         "mxu_probe": cmd_mxu_probe}


def _stop(signum, frame):
    """Ctrl-C and SIGTERM (what CI sends a cancelled job) end a run alike: the finished cases kept, the hint to
    resume printed, exit 130. The request is also kept (:data:`harness.app.workers.STOP`) because the
    KeyboardInterrupt raised here can land where Python swallows it (a garbage-collection callback of jax's,
    seen with libtpu loaded): the walk of the cases then stops before the next case."""
    from harness.app.workers import STOP

    STOP.set()
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    import signal
    import threading

    from harness.app.workers import STOP

    STOP.clear()
    previous = {}
    if threading.current_thread() is threading.main_thread():  # a handler can be set only there
        previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    hook = sys.unraisablehook

    def quiet(unraisable):  # the swallowed KeyboardInterrupt of a stop that STOP carries on: no traceback for it
        if not (STOP.is_set() and isinstance(unraisable.exc_value, KeyboardInterrupt)):
            hook(unraisable)

    sys.unraisablehook = quiet
    try:
        return _main(argv)
    finally:
        sys.unraisablehook = hook
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help is 0, bad usage is 2
        return int(exc.code or 0)
    from harness.core.results import ReportError

    try:
        for text in getattr(args, "impl", []):
            register_implementation(*parse_impl(text))
        if getattr(args, "backend", None):
            check_implementation(args.backend)  # an unknown leg, or one that does not load: before any work
        return VERBS[args.verb_fn](args)
    except Interrupted as exc:
        print(f"parity: {exc}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (UsageError, ReportError, ValueError) as exc:
        print(f"parity: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # a path the checks above could not foresee (disk full, permissions changed)
        print(f"parity: error: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
