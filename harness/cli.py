"""``parity``: list cases, run legs, gate result files, or do it all.

Exit codes: 0 pass; 1 a parity or bound violation (or an error row); 2 usage
or input error (bad arguments, unwritable paths, unreadable, malformed or stale
result files); 130 interrupted (the finished cases are kept: see --resume).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from harness.legs.registry import (BUILTIN, check_implementation, default_leg, leg_spec, legs,
                                   parse_impl, register_implementation)
from harness.core.noise import LOOKS
from harness.core.status import CAUSALITY_FAILING, FAILING, Status
from harness.app.workers import GIB_PER_JOB, Workers, default_jobs, parse_jobs

EXIT_PASS, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
EXIT_INCONCLUSIVE = 3  # the gate's draws did not decide a comparison: never a pass
_SEVERITY = (EXIT_PASS, EXIT_INCONCLUSIVE, EXIT_FAIL)


def _worse(a: int, b: int) -> int:
    """The exit status of two outcomes together: a failure outranks an inconclusive gate, which outranks a pass."""
    return max(a, b, key=_SEVERITY.index)
EXIT_INTERRUPTED = 130  # Ctrl-C, as the shell reports it
DEFAULT_OUT = Path("reports") / "runs"


class UsageError(Exception):
    pass


def _selection(args):
    """The run's cases, as the pytest plugin selects them too (:class:`harness.app.Selection`)."""
    from harness.app import Selection

    return Selection(suite=getattr(args, "suite", "") or "", case_ids=tuple(getattr(args, "case", None) or ()),
                     cases_files=tuple(getattr(args, "cases_file", None) or ()), ops=tuple(getattr(args, "op", None) or ()),
                     draws=getattr(args, "draws", 1), shard=getattr(args, "shard", None))


def _select_cases(args) -> list:
    return _selection(args).cases()


def _leg_options(args, name: str) -> dict:
    """The command line's options for a leg, by its role: the reference's method and dtype, the baseline's dot
    precision, a candidate's real-TPU compile targets."""
    role = leg_spec(name).role
    if role == "reference":
        return {"method": args.ref_method, "compute_dtype": args.ref_dtype}
    if role == "baseline":
        return {"dot_precision": args.dot_precision}
    from harness.compile.tpu_compile import LEG_DEFAULT_TARGETS, parse_targets

    return {"compile_targets": parse_targets(args.tpu_targets, LEG_DEFAULT_TARGETS)}


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


class Interrupted(Exception):
    """Ctrl-C during a leg: its finished cases are kept in the partial file."""


def _leg_cache(leg, args):
    """The leg's output cache (the GPU and reference legs' baseline cache, the TPU leg's candidate cache; read
    unless --no-baseline-cache), or None for a leg that is not cached (an external candidate)."""
    from harness.run.baseline_cache import for_leg

    return for_leg(leg, read=not getattr(args, "no_baseline_cache", False))


def _run_leg(name: str, args, cases, cache, path: Path | None = None) -> tuple[Path, "object"]:
    from harness.legs import make_leg
    from harness.core.results import summarize
    from harness.run.result_file import ResultFile
    from harness.run.runner import Runner

    options = _leg_options(args, name)
    leg = make_leg(name, **options)
    selection = _selection(args)
    leg_cache = _leg_cache(leg, args)
    runner = Runner(leg, cache, suite=selection.suite_label, leg_cache=leg_cache)
    resume = args.resume and path is None
    path = path or Path(args.out) / selection.result_name(name, tag=getattr(args, "tag", None), cases=cases)
    t0 = time.perf_counter()
    with ResultFile(path, runner.provenance, force=args.force, resume=resume) as out:
        todo = [c for c in cases if c.id not in out.done]
        if out.done:
            print(f"{name}: resuming {out.partial}: {len(cases) - len(todo)} of {len(cases)} cases already done")
        try:
            args.workers.run(runner, options, todo, on_case=lambda case, rows: out.append(rows),
                             progress=None if args.no_progress else f"{name} leg")
        except KeyboardInterrupt:
            raise Interrupted(f"{name} leg interrupted; the finished cases are kept in {out.partial}. Continue "
                              f"with the same command plus --resume (the gate fails that file as incomplete "
                              f"unless given --allow-missing)") from None
        df = out.finish()
    print(f"{name}: {len(todo)} cases in {time.perf_counter() - t0:.1f} s "
          f"({runner.provenance['mode']}, {runner.provenance['device']}) -> {path}")
    if leg_cache is not None:
        print(f"{name}: {leg_cache.summary(leg_cache.hits, len(todo))}")
    print(f"  rows: {summarize(df)}")
    return path, df


def _run_causality(name: str, args, cases) -> "object":
    from harness.probes.causality import causality_cases, causality_frame
    from harness.legs import make_leg
    from harness.run.reference_cache import ReferenceCache
    from harness.run.result_file import write_check_file
    from harness.run.runner import Runner

    path = Path(args.out) / ("causality-" + _selection(args).result_name(name, tag=getattr(args, "tag", None),
                                                                        cases=cases))
    chosen = causality_cases(cases)
    t0 = time.perf_counter()
    options = _leg_options(args, name)
    if "compile_targets" in options:  # a perturbed run has the case's own shapes: the leg run compiles them once
        options["compile_targets"] = ()
    leg = make_leg(name, **options)
    leg_cache = _leg_cache(leg, args)
    rows = []
    # no golden is compared: an in-memory reference cache that stays empty
    args.workers.run(Runner(leg, ReferenceCache(None), leg_cache=leg_cache), options, chosen,
                     on_case=lambda case, case_rows: rows.extend(case_rows), task="causality",
                     progress=None if args.no_progress else f"{name} causality")
    df = causality_frame(rows)
    path = write_check_file(df, path, name, force=getattr(args, "force", False))
    bad = df[df["status"].isin(CAUSALITY_FAILING)]
    exact = int(df["bit_exact"].sum())
    print(f"{name} causality: {len(chosen)} cases in {time.perf_counter() - t0:.1f} s, {exact}/{len(df)} "
          f"bit-exact, {len(bad)} failing -> {path}")
    if leg_cache is not None:
        print(f"{name} causality: {leg_cache.summary(leg_cache.hits, leg_cache.hits + leg_cache.misses, 'runs')}")
    for r in bad.to_dict("records"):
        print(f"  {r['status'].upper()} {r['case_id']} {r['tensor']}: {r['reason']}")
    return df


def _failing(df) -> bool:
    return bool(df["status"].isin(FAILING).any())


def _policy(args):
    from harness.core.policy import policy_from_options

    return policy_from_options(args.policy, args.gate_metrics, args.margin, args.floor, args.alpha)


def _junit_target(args) -> Path | None:
    """``--junit FILE``, checked before any work: never over a file the gate did not write, unless --force."""
    if not args.junit:
        return None
    from harness.report.junit import check_junit_path

    return check_junit_path(args.junit, args.force)


def _report_gate(result, out: Path, junit: Path | None = None, force: bool = False) -> int:
    from harness.app import write_gate

    csv_path, md_path = write_gate(result, out)
    counts = result.parity.groupby("verdict").size().to_dict()
    print(f"gate: {result.headline} ({', '.join(f'{n} {v}' for v, n in sorted(counts.items()))})"
          f" -> {csv_path}, {md_path}, {md_path.with_suffix('.html')} (heatmap: {md_path.with_suffix('.png')})")
    if junit is not None:
        from harness.report.junit import write_junit

        print(f"gate: JUnit XML, one test case per (case, tensor) -> {write_junit(result, junit, force)}")
    for r in result.failures.to_dict("records")[:20]:
        print(f"  FAIL {r['case_id']} {r['tensor']} {r['metric']}: {r['reason']}\n       repro: {r['repro']}")
    if len(result.failures) > 20:
        print(f"  ... and {len(result.failures) - 20} more in {csv_path}")
    if result.failures.empty and not result.inconclusive.empty:
        for r in result.inconclusive.to_dict("records")[:20]:
            print(f"  INCONCLUSIVE {r['case_id']} {r['tensor']} {r['metric']}: {r['reason']}")
        return EXIT_INCONCLUSIVE
    return EXIT_PASS if result.passed else EXIT_FAIL


def _drawn_by(base, candidate, cases):
    """The baseline rows a candidate is gated on in ``parity all``: the selected cases', and the extra draws the
    candidate ran too. With several candidates, the draws run to decide one candidate's comparison are not
    another's evidence, nor missing from its file (``parity gate`` on the files, which cannot know why a draw is
    there, fails them unless ``--allow-missing``)."""
    ids = {c.id for c in cases} | set(candidate["case_id"])
    return base[base["case_id"].isin(ids)]


def _redraw(result, frames: dict, paths: dict, legs: tuple[str, str], args, cases, cache, options: dict):
    """``parity all``'s sequential test: while the gate of ``legs`` (baseline, candidate) has inconclusive
    comparisons short of the cap (``--max-draws``), run each leg on the draws that decide them which it does
    not have yet (an earlier candidate's draws may have given the baseline some), fold the rows into each leg's
    result file (so ``parity gate`` on the files gives the same verdict; with several candidates,
    ``--allow-missing`` for the draws a candidate did not run: :func:`_drawn_by`), and gate again.

    Only the undecided comparisons drive a case's redraws: each case is drawn up to the next look of its own
    inconclusive comparisons, which the progress lines name. The gate leaves the comparisons its first draw
    decided as they were (:func:`harness.judge.gate._pool_draws`), so the case's other tensors gain no verdict from
    these draws."""
    import pandas as pd

    from harness.judge.gate import apply_gate, undrawn_id
    from harness.core.noise import next_look
    from harness.run.result_file import ResultFile
    from harness.core.results import write_csv

    cap = getattr(args, "max_draws", LOOKS[-1])
    by_id = {c.replace(seed=0).id: c.replace(seed=0) for c in cases}
    while not result.inconclusive.empty:
        todo = []
        for base_id, undecided in result.inconclusive.groupby(result.inconclusive["case_id"].map(undrawn_id)):
            drawn = int(undecided["draws"].max())
            need = min(next_look(drawn) or drawn, cap)
            have = {int(d) for d in frames[legs[1]].loc[frames[legs[1]]["case_id"].map(undrawn_id) == base_id,
                                                        "draw"].dropna()}
            more = [by_id[base_id].replace(seed=s) for s in range(need) if s not in have]
            if more:
                what = sorted({f"{t} {m}" for t, m in zip(undecided["tensor"], undecided["metric"])})
                print(f"gate: {base_id}: {', '.join(what)} undecided at {drawn} draw(s): {len(more)} more, "
                      f"to {need}")
            todo += more
        if not todo:  # at the cap, or the legs could not give the draws (refused, errored): inconclusive stays
            break
        for name in legs:
            have = set(frames[name]["case_id"])
            missing = [c for c in todo if c.id not in have]
            if not missing:
                continue
            extra = paths[name].with_name(f"{paths[name].stem}.redraws.csv")
            for scratch in (extra, extra.with_name(f"{extra.stem}.partial.csv")):  # parity all's own, from a crash
                scratch.unlink(missing_ok=True)
            _, rows = _run_leg(name, args, missing, cache, path=extra)
            frames[name] = pd.concat([frames[name], rows], ignore_index=True)
            with ResultFile(paths[name], {"leg": name, "suite": _selection(args).suite_label}, force=True):
                write_csv(frames[name], paths[name])
            extra.unlink()
            print(f"{name}: {len(rows)} rows of the new draws folded into {paths[name]}")
        result = apply_gate(_drawn_by(frames[legs[0]], frames[legs[1]], cases), frames[legs[1]], _policy(args),
                            **options)
    return result


# -------------------------------------------------------------------- verbs
def ptx_leg_inputs(leg: str, suite: str, case_ids) -> dict:
    """``parity ptx``'s view of the leg whose launches it records: the selected cases and what the leg's outputs
    on them depend on (:func:`harness.run.baseline_cache.leg_inputs`); ValueError for a bad selection."""
    from harness.app import Selection
    from harness.run.baseline_cache import leg_inputs

    return leg_inputs(leg, Selection(suite="" if case_ids else suite, case_ids=tuple(case_ids)).cases())


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
        t = tables(root, _policy(args))
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
          f"-> {mine}, {root / 'index.html'}")
    return EXIT_PASS


def cmd_cases(args) -> int:
    """One line per case: its id and compared tensors; with ``--inputs``, then one indented line per input a
    candidate binding's forward receives (name, shape, dtype). For your own cases (by id or file), a note on
    stderr where a kernel binding already refuses the case, so the refusal is seen when the case is made."""
    from harness.app import binding_inputs
    from harness.ops import get_op

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
    from harness.run.reference_cache import ReferenceCache

    cases = _select_cases(args)
    _out_dir(args.out)
    cache = ReferenceCache(None if args.no_ref_cache else "default")
    _, df = _run_leg(args.backend, args, cases, cache)
    return EXIT_FAIL if _failing(df) else EXIT_PASS


def cmd_causality(args) -> int:
    cases = _select_cases(args)
    _out_dir(args.out)
    df = _run_causality(args.backend, args, cases)
    return EXIT_FAIL if df["status"].isin(CAUSALITY_FAILING).any() else EXIT_PASS


def _gate_options(args) -> dict:
    return {"allow_missing": args.allow_missing, "baseline_leg": args.baseline_leg,
            "candidate_leg": args.candidate_leg}


def cmd_gate(args) -> int:
    from harness.judge.gate import gate_files

    policy = _policy(args)
    out = _out_dir(args.out)
    _step_summary()
    junit = _junit_target(args)
    from harness.app import result_in

    options = _gate_options(args)
    baseline = result_in(args.gpu_csv, options["baseline_leg"])
    candidate = result_in(args.tpu_csv, options["candidate_leg"])
    return _report_gate(gate_files(baseline, candidate, policy, **options), out, junit, args.force)


def cmd_compile(args) -> int:
    from harness.core.results import write_csv
    from harness.probes.compile_cases import RecordError, compile_frame, read_record, reused_rows
    from harness.compile.tpu_compile import COMPILE_DEFAULT_TARGETS, parse_targets, versions

    targets = parse_targets(args.target, COMPILE_DEFAULT_TARGETS)
    cases = _select_cases(args)
    _out_dir(args.out)
    reuse = [Path(p) for text in args.reuse or () for p in text.split(",") if p.strip()]
    try:
        record = read_record(reuse)
    except RecordError as exc:
        raise UsageError(str(exc)) from None
    v = versions()
    print(f"compile: {len(cases)} cases x {', '.join(targets)} with jax {v['jax']}, libtpu {v['libtpu']}")
    from harness.legs import make_leg
    from harness.run.reference_cache import ReferenceCache
    from harness.run.runner import Runner

    if leg_spec(args.backend).role != "candidate":
        raise UsageError(f"--backend {args.backend} is the {leg_spec(args.backend).role} leg; compile a candidate")
    options = {"compile_targets": ()}
    runner = Runner(make_leg(args.backend, **options), ReferenceCache(None))  # its steps up to the run, nothing more
    if getattr(runner.leg, "gpu_only", False):
        raise UsageError(f"--backend {args.backend} declares platform 'gpu': its kernels are not compiled for TPU "
                         f"targets (docs/legs.md, A GPU implementation)")
    t0 = time.perf_counter()
    settled = {case.id: reused_rows(case, targets, runner, record) for case in cases}
    todo = [case for case in cases if settled[case.id] is None]
    if reuse:
        print(f"compile: {len(cases) - len(todo)} of {len(cases)} cases reused from {', '.join(map(str, reuse))} "
              f"(the content key of every target's row unchanged: sources, versions, case), {len(todo)} to compile")
    args.workers.run(runner, options, todo, on_case=lambda case, compiled: settled.update({case.id: compiled}),
                     task="compile", targets=targets, progress=None if args.no_progress else "compile")
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
    return EXIT_FAIL if len(bad) else EXIT_PASS


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
    from harness.run.reference_cache import ReferenceCache
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
        cache = ReferenceCache(None if args.no_ref_cache else "default")
        (_, gpu), (_, tpu) = (_run_leg(leg, args, cases, cache) for leg in pair)
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


def _baseline_rows(path: Path, base: str, cases) -> "object":
    """The baseline leg's rows of the selected cases, from a result file made on another machine (exit 2 when
    the file is not the baseline's or lacks a selected case)."""
    from harness.core.results import read_results

    rows = read_results(path)
    legs = sorted(rows["leg"].dropna().unique())
    if legs != [base]:
        raise UsageError(f"--baseline-rows {path} holds rows of {', '.join(legs) or 'no leg'}, not of the {base} leg")
    wanted = [c.id for c in cases]
    missing = [i for i in wanted if i not in set(rows["case_id"])]
    if missing:
        raise UsageError(f"--baseline-rows {path} lacks {len(missing)} of the {len(wanted)} selected cases (first: "
                         f"{missing[0]}); make them where fla runs: parity run --backend {base} with the same "
                         "selection")
    return rows[rows["case_id"].isin(wanted)].reset_index(drop=True)


def cmd_all(args) -> int:
    from harness.judge.gate import apply_gate
    from harness.run.reference_cache import ReferenceCache

    if args.max_draws < 1:
        raise UsageError(f"--max-draws {args.max_draws}: give at least 1 (1 draws nothing more)")

    for name in args.candidate:
        if leg_spec(name).role != "candidate":
            raise UsageError(f"--candidate {name} is the {leg_spec(name).role} leg, not a candidate")
        check_implementation(name)
    cases = _select_cases(args)
    policy = _policy(args)
    out = _out_dir(args.out)
    _step_summary()
    junit = _junit_target(args)
    cache = ReferenceCache(None if args.no_ref_cache else "default")
    frames, paths, status = {}, {}, EXIT_PASS
    base, ours = default_leg("baseline"), default_leg("candidate")
    runs = [(name, why_not, True) for name, why_not in available_legs().items()]
    runs += [(name, leg_spec(name).missing(), True) for name in args.candidate]  # gated below; causality too
    if args.baseline_rows:  # made where fla runs: the baseline is not run here
        paths[base], frames[base] = args.baseline_rows, _baseline_rows(args.baseline_rows, base, cases)
        runs = [r for r in runs if r[0] != base]
        print(f"{base}: {frames[base]['case_id'].nunique()} cases' rows from {args.baseline_rows}")
    for name, why_not, causality in runs:
        if why_not:
            print(f"{name}: skipped, {why_not}")
            continue
        paths[name], frames[name] = _run_leg(name, args, cases, cache)
        if _failing(frames[name]):
            status = EXIT_FAIL
        if causality and not args.no_causality:
            causal = _run_causality(name, args, cases)
            if causal["status"].isin(CAUSALITY_FAILING).any():
                status = EXIT_FAIL
    if base in frames and ours in frames:
        result = apply_gate(frames[base], frames[ours], policy, **_gate_options(args))
        if not args.baseline_rows:  # more draws need the baseline run here too
            result = _redraw(result, frames, paths, (base, ours), args, cases, cache, _gate_options(args))
        status = _worse(status, _report_gate(result, out, junit, args.force))
    else:
        print(f"gate: skipped, it needs both the {base} and the {ours} legs" + (f"; no {junit} written" if junit else ""))
    extra = [name for name in args.candidate if name in frames and base in frames]
    for name in extra:
        print(f"gate of {name} (in {out / name}):")
        options = {**_gate_options(args), "candidate_leg": name}
        result = apply_gate(_drawn_by(frames[base], frames[name], cases), frames[name], policy, **options)
        if not args.baseline_rows:  # its own inconclusive comparisons get their draws, as this project's do
            result = _redraw(result, frames, paths, (base, name), args, cases, cache, options)
        status = _worse(status, _report_gate(result, _out_dir(out / name)))
    if extra:
        from harness.report.peer_report import peer_markdown, peer_table
        from harness.core.results import atomic_write_text, write_csv

        table = peer_table(frames[base], [frames[n] for n in [ours, *extra] if n in frames], policy)
        write_csv(table, out / "peers.csv")
        atomic_write_text(out / "peers.md", peer_markdown(table, f"Candidates against fla: {', '.join(extra)}"))
        print(f"peers: {len(table)} rows (case x forward tensor x candidate) -> {out / 'peers.csv'}, "
              f"{out / 'peers.md'}")
    return status


# ------------------------------------------------------------------- parser
def _add_selection(p, shard=True):
    p.add_argument("--suite", default="smoke",
                   help="suite name, or several joined by commas: smoke, regressions, standard, stress")
    p.add_argument("--case", action="append", default=[], metavar="ID",
                   help="run just this case (repeatable; overrides --suite): a suite case's id, or any "
                        "well-formed id of a case of your own, e.g. "
                        "simple_gla.chunk/B1-T80-H1-K128-V128/bf16/g=logsigmoid/16/C64/h0")
    p.add_argument("--cases-file", action="append", default=[], metavar="TOML",
                   help="run the cases of this TOML file (repeatable; overrides --suite, adds to --case): "
                        "[[case]] tables of Case fields or ids, [[grid]] tables expanded over their lists; "
                        "see cases/examples/my_cases.toml")
    p.add_argument("--op", action="append", default=[],
                   help="keep only cases of this op, or of several joined by commas: simple_gla,gla (repeatable)")
    p.add_argument("--draws", type=int, default=1, metavar="N",
                   help="run each case over N input draws: Case.seed 0..N-1 (the id says seed=k for k > 0)")
    if shard:
        p.add_argument("--shard", metavar="i/n", help="deterministic shard i of n (0-based)")


def _add_impl(p):
    p.add_argument("--impl", action="append", default=[], metavar="NAME=module:object",
                   help="register an implementation as the candidate leg NAME (harness.legs.external: per op "
                        "a binding of its forward, refusals and packed sequences); repeatable")


def _add_run_options(p, resume: bool = True):
    p.add_argument("--out", default=str(DEFAULT_OUT), help=f"output directory (default {DEFAULT_OUT})")
    p.add_argument("--tag", help="insert a tag in result file names, e.g. gpu.<tag>.csv")
    if resume:
        p.add_argument("--resume", action="store_true",
                       help="continue an interrupted run from its <leg>.partial.csv, skipping the cases it has")
    p.add_argument("--force", action="store_true",
                   help="overwrite a result file of another suite, or discard an interrupted run's partial file")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--jobs", "-j", metavar="N",
                   help="use up to N cores: each leg runs N // (the cores one of its cases keeps busy: 2 for the "
                        "emulated TPU leg, else 1) cases at once, each in a worker process (default: $PARITY_JOBS, "
                        f"else one per CPU and per {GIB_PER_JOB} GiB of memory; 1: no workers); cases the caches "
                        "serve never start one, and the rows come out in case order at any N")
    p.add_argument("--no-ref-cache", action="store_true", help="do not read or write the on-disk reference cache")
    p.add_argument("--no-baseline-cache", "--no-gpu-cache", dest="no_baseline_cache", action="store_true",
                   help="run the GPU, reference and TPU legs (and their causality runs) again instead of reusing "
                        "their caches; the fresh results replace the entries (--no-gpu-cache: the old name)")
    p.add_argument("--ref-method", default="recurrent", choices=("recurrent", "chunk"),
                   help="reference leg: formulation recomputed against the chunked golden (default recurrent)")
    p.add_argument("--ref-dtype", default="float64", choices=("float64", "float32"),
                   help="reference leg: compute dtype (float32 gives a second honest result file)")
    p.add_argument("--tpu-targets", metavar="T,..",
                   help="TPU leg, when emulated: compile each case for these real TPU targets first, a case that "
                        "does not compile is an error (default v6e; of v4, v5e, v5p, v6e, v7x)")
    p.add_argument("--dot-precision", default=None, choices=("tf32", "tf32x3", "ieee"),
                   help="GPU leg: TRITON_F32_DEFAULT for f32 tl.dot without an explicit input_precision "
                        "(default: the environment's, else tf32 as on an H100)")


def _add_gate_options(p):
    p.add_argument("--allow-missing", action="store_true",
                   help="a (case, tensor) in one file only is counted and shown, not failed (a deliberate subset)")
    p.add_argument("--baseline-leg", default=default_leg("baseline"),
                   help=f"the leg the baseline file must come from (default {default_leg('baseline')})")
    p.add_argument("--candidate-leg", default=default_leg("candidate"),
                   help=f"the leg the candidate file must come from (default {default_leg('candidate')}; "
                        "any registered leg, e.g. an --impl)")
    _add_impl(p)
    p.add_argument("--junit", metavar="FILE",
                   help="also write the verdicts as JUnit XML, one test case per (case, tensor); replaces only a "
                        "file an earlier gate wrote, unless --force")


def _add_policy(p):
    p.add_argument("--policy", metavar="TOML",
                   help="policy file, e.g. a policy.toml written by `parity calibrate` (default: the shipped, "
                        "calibrated harness/policy.toml); the options below override it")
    p.add_argument("--gate-metrics",
                   help="comma-separated metrics to gate (of max_abs, rel_l2, ulp_max, ulp_mean, ulp_p99)")
    p.add_argument("--margin", type=float,
                   help="one relative margin for every metric, replacing the policy's: allow eps_gpu*(1+margin)")
    p.add_argument("--floor", help="absolute floors, e.g. rel_l2=1e-6,max_abs=1e-5")
    p.add_argument("--alpha", type=float,
                   help="one-sided level of the rel_l2 bootstrap (0: judge the point value alone)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="verb", required=True)

    p = sub.add_parser("cases", help="list the case ids of a suite and the tensors each compares")
    _add_selection(p)
    p.add_argument("--inputs", action="store_true",
                   help="under each case, every input a candidate binding's forward receives: name, shape, dtype")
    p.set_defaults(fn=cmd_cases)

    p = sub.add_parser("run", help="run one leg over a suite and write its result CSV")
    p.add_argument("--backend", required=True, metavar="LEG",
                   help=f"which leg to run: {', '.join(legs())}, or an implementation named by --impl")
    _add_impl(p)
    _add_selection(p)
    _add_run_options(p)
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("causality", help="check that inputs after t0 do not change o and dq up to t0")
    p.add_argument("--backend", required=True, metavar="LEG",
                   help=f"which leg to check: {', '.join(legs())}, or an implementation named by --impl")
    _add_impl(p)
    _add_selection(p)
    _add_run_options(p, resume=False)  # a check is re-run whole: there is nothing to resume
    p.set_defaults(fn=cmd_causality)

    p = sub.add_parser("gate", help="apply eps_TPU <= eps_GPU to two result files")
    p.add_argument("gpu_csv", help="baseline result file (the GPU leg), or a directory holding exactly one")
    p.add_argument("tpu_csv", help="candidate result file (the TPU leg), or a directory holding exactly one")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="where parity.csv and parity.md go")
    _add_policy(p)
    _add_gate_options(p)
    p.add_argument("--force", action="store_true", help="overwrite a --junit FILE that the gate did not write")
    p.set_defaults(fn=cmd_gate)

    p = sub.add_parser("compile", help="compile every TPU case (forward and backward) for real TPU targets "
                                       "with libtpu, no TPU needed; writes compile.csv")
    _add_selection(p)
    p.add_argument("--target", metavar="T,..", help="TPU targets (default v5e,v6e,v7x; of v4, v5e, v5p, v6e, v7x)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help=f"output directory (default {DEFAULT_OUT})")
    p.add_argument("--tag", help="insert a tag in the file name: compile.<tag>.csv")
    p.add_argument("--reuse", action="append", metavar="CSV[,CSV]",
                   help="earlier compile.csv files (gzipped or not): an ok row whose content key (the sources, "
                        "versions and case it was made from, the target) is the one this compile would have is "
                        "reused, not compiled again; any other case compiles (repeatable)")
    p.add_argument("--backend", default=default_leg("candidate"), metavar="LEG",
                   help="the candidate leg whose binding compiles (default tpu, this project's kernels; another "
                        "writes compile.<leg>.csv)")
    _add_impl(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--jobs", "-j", metavar="N",
                   help="compile N cases at once, each in a worker process (libtpu compiles on one core; default: "
                        f"$PARITY_JOBS, else one per CPU and per {GIB_PER_JOB} GiB of memory; 1: no workers); the "
                        "rows come out in case order at any N")
    p.set_defaults(fn=cmd_compile)

    p = sub.add_parser("peers", help="one table for every peer: README.md and index.html from the rows of every "
                                     "report under a folder (default reports/peers)")
    p.add_argument("--root", default="reports/peers", help="the folder of reports (default reports/peers)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if the pages differ from the rows")
    p.add_argument("--force", action="store_true", help="replace a README.md that parity peers did not write")
    _add_policy(p)
    p.set_defaults(fn=cmd_peers)

    p = sub.add_parser("merge", help="merge shard result files of one leg into one CSV")
    p.add_argument("-o", "--output", required=True, help="merged CSV to write (never one of the inputs)")
    p.add_argument("inputs", nargs="+", help="shard CSVs")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    p.add_argument("--allow-mixed", action="store_true",
                   help="merge files of different suites, commits, modes or devices")
    p.set_defaults(fn=cmd_merge)

    p = sub.add_parser("calibrate", help="run the gpu and tpu legs over several input draws and report the "
                                         "policy's false-alarm rate and the ratio noise band on clean kernels")
    _add_selection(p)
    p.set_defaults(draws=5)
    _add_run_options(p)
    _add_policy(p)
    p.add_argument("--results", nargs=2, metavar=("GPU.csv", "TPU.csv"),
                   help="calibrate from these result files instead of running the legs")
    p.set_defaults(fn=cmd_calibrate)

    from harness.probes import mxu_probe
    from harness.emulation import ptx

    mxu_probe.add_parser(sub)
    # the leg whose fla launches it records, and what that leg's outputs on the cases depend on (its record's key)
    ptx.add_parser(sub).set_defaults(backend=default_leg("baseline"), leg_inputs=ptx_leg_inputs)

    p = sub.add_parser("all", help="run every leg this machine can run (emulated without hardware), then gate")
    _add_selection(p, shard=False)
    _add_run_options(p)
    _add_policy(p)
    _add_gate_options(p)
    p.add_argument("--no-causality", action="store_true",
                   help="skip the causality and isolation check (one case per op and variant) of every leg, "
                        "the candidates' included")
    p.add_argument("--baseline-rows", type=Path, metavar="GPU.csv",
                   help="the baseline leg's rows, made where fla runs (parity run --backend gpu, same selection): "
                        "not run here (a TPU-side stack has no torch); inconclusive comparisons then stay so "
                        "(exit 3) rather than drawing more")
    p.add_argument("--candidate", action="append", default=[], metavar="LEG",
                   help="also run this candidate (a registered implementation, e.g. tpu-inference, or --impl) and "
                        "gate it against the gpu leg in OUT/LEG/; OUT/peers.md then compares the candidates "
                        "(repeatable)")
    p.add_argument("--max-draws", type=int, default=LOOKS[-1], metavar="N",
                   help=f"draw an inconclusive case at most N times in all (default {LOOKS[-1]}, the sequential "
                        f"test's cap; the looks are at {', '.join(map(str, LOOKS))} draws): a comparison still "
                        "undecided stays inconclusive (exit 3) and names the draws that would decide it")
    p.set_defaults(fn=cmd_all)
    return parser


def main(argv: list[str] | None = None) -> int:
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
        if not hasattr(args, "jobs"):
            return args.fn(args)
        jobs = default_jobs() if args.jobs is None else parse_jobs(args.jobs)
        with Workers(jobs) as args.workers:
            return args.fn(args)
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
