"""``parity``: the front of the command line. Each verb turns its parsed arguments into settings records once
(:mod:`harness.app.settings`) and runs the stages of a run (:class:`harness.app.session.Run`); the options
themselves are declared in :mod:`harness.parser`.

Exit codes (docs/faults.md): 0 pass; 1 a parity or bound violation (or an error row); 2 usage or input error
(bad arguments, unwritable paths, unreadable, malformed or stale result files); 3 inconclusive (never a pass); 4
a case's process exited, crashed or ran past --case-timeout (its rows say how; the other cases ran); 130
interrupted by Ctrl-C or SIGTERM (the finished cases are kept: see --resume).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from harness.app.selection import Selection
from harness.app.session import Interrupted, Outcome, Run, writable
from harness.app.settings import (GateSettings, LegOptions, RunSettings, check_file_size_limit, environment_grids,
                                  parse_case_timeout)
from harness.app.workers import default_jobs, parse_jobs
from harness.core.cache_dir import default_cache_dir
from harness.legs.registry import check_implementation, leg_spec, parse_impl, register_implementation
from harness.parser import DEFAULT_OUT, build_parser  # noqa: F401  (build_parser: the CI templates' test reads it)

EXIT_PASS, EXIT_FAIL, EXIT_USAGE = int(Outcome.PASS), int(Outcome.FAIL), 2
EXIT_INCONCLUSIVE = int(Outcome.INCONCLUSIVE)  # the gate's draws did not decide a comparison: never a pass
EXIT_LOST = int(Outcome.LOST)  # a case's process exited, crashed or ran past --case-timeout: the run is not whole
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM, as the shell reports Ctrl-C


class UsageError(Exception):
    pass


# ------------------------------------------------------------ settings, once
def selection_of(args) -> Selection:
    """The run's cases, as the pytest plugin selects them too (:class:`harness.app.selection.Selection`)."""
    return Selection(suite=getattr(args, "suite", "") or "", case_ids=tuple(getattr(args, "case", None) or ()),
                     cases_files=tuple(getattr(args, "cases_file", None) or ()), ops=tuple(getattr(args, "op", None) or ()),
                     draws=getattr(args, "draws", 1), shard=getattr(args, "shard", None))


def select_cases(args) -> list:
    return selection_of(args).cases()


def _jobs(args) -> int:
    return default_jobs(os.environ) if args.jobs is None else parse_jobs(args.jobs)


def _leg_options(args, **options) -> LegOptions:
    """The legs' options from the arguments, the grids from ``--grid`` or else the environment (read here once)."""
    grids = environment_grids(os.environ)
    if getattr(args, "grid", None):
        grids = dict.fromkeys(grids, args.grid)
    return LegOptions.parse(args.tpu_targets, **grids, **options)


def run_settings(args) -> RunSettings:
    """``parity run``, ``causality``, ``calibrate`` and ``all``'s run, from their arguments (and
    ``$PARITY_CACHE_DIR``, read here once)."""
    legs = _leg_options(args, ref_method=args.ref_method, ref_dtype=args.ref_dtype, dot_precision=args.dot_precision)
    candidates = tuple(getattr(args, "candidate", None) or ())
    for name in candidates:  # parity all's further candidates: each registered and loading here, before any work
        if leg_spec(name).role == "candidate":
            check_implementation(name)
    return RunSettings(selection=selection_of(args), out=Path(args.out), tag=args.tag, force=args.force,
                       resume=getattr(args, "resume", False), jobs=_jobs(args),
                       reference_cache=not args.no_ref_cache, read_leg_cache=not args.no_baseline_cache, legs=legs,
                       progress=not args.no_progress, case_timeout=parse_case_timeout(args.case_timeout),
                       cache_dir=default_cache_dir(os.environ),
                       baseline_rows=tuple(getattr(args, "baseline_rows", None) or ()),
                       baseline_python=getattr(args, "baseline_python", None), candidates=candidates,
                       causality=not getattr(args, "no_causality", False))


def _policy(args):
    from harness.core.policy import policy_from_options

    return policy_from_options(args.policy, args.gate_metrics, args.margin, args.floor, args.alpha)


def gate_settings(args) -> GateSettings:
    """``parity gate`` and ``all``'s gate, from their arguments (and ``$GITHUB_STEP_SUMMARY``, read here once):
    the policy loaded once, ``--junit`` and the step summary checked before any work."""
    extra = {"max_draws": args.max_draws} if hasattr(args, "max_draws") else {}  # parity all's cap on draws
    if hasattr(args, "gpu_csv"):  # parity gate: which rows of the files are judged
        selected = args.suite or args.case or args.cases_file
        extra.update(allow_partial=args.allow_partial, ops=tuple(o.strip() for t in args.op for o in t.split(",")
                                                                 if o.strip()),
                     cases=Selection(suite=args.suite or "", case_ids=tuple(args.case),
                                     cases_files=tuple(args.cases_file)) if selected else None)
    return GateSettings(policy=_policy(args), baseline_leg=args.baseline_leg, candidate_leg=args.candidate_leg,
                        allow_missing=args.allow_missing, junit=_junit_target(args), force=args.force,
                        step_summary=_step_summary(), **extra)


def _out_dir(path) -> Path:
    """The output directory, made and proven writable before any work (a bad --out must not cost a run)."""
    try:
        return writable(path)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _step_summary() -> Path | None:
    """``$GITHUB_STEP_SUMMARY``, when set: a file the gate can append to, checked before any work."""
    value = os.environ.get("GITHUB_STEP_SUMMARY")
    if not value:
        return None
    path = Path(value)
    if path.is_dir() or not os.access(path if path.exists() else path.parent, os.W_OK):
        raise UsageError(f"$GITHUB_STEP_SUMMARY={value} is not a file the gate can append to")
    return path


def _junit_target(args) -> Path | None:
    """``--junit FILE``, checked before any work: never over a file the gate did not write, unless --force."""
    if not args.junit:
        return None
    from harness.report.junit import check_junit_path

    return check_junit_path(args.junit, args.force)


# -------------------------------------------------------------------- verbs
def cmd_ptx(args) -> int:
    from harness.app import ptx_leg
    from harness.emulation import ptx

    return ptx.sweep(suite=args.suite, case=args.case, target=args.target, out=args.out, launches=args.launches,
                     reuse=args.reuse, backend=args.backend, leg_inputs=ptx_leg.leg_inputs,
                     capture_command=ptx_leg.capture_command)


def cmd_mxu_probe(args) -> int:
    from harness.probes import mxu_probe

    return mxu_probe.probe(precision=args.precision, target=args.target, out=args.out)


def cmd_peers(args) -> int:
    """``reports/peers/README.md`` and ``index.html`` from every report's rows
    (:func:`harness.report.peer_table.write_pages`); ``--check`` writes nothing and exits 1 when the page differs
    from what the rows give."""
    from harness.report.peer_table import write_pages

    root = Path(args.root)
    if not root.is_dir():
        raise UsageError(f"{root} is not a folder of reports (each a folder with gpu.csv[.gz] and candidates' rows)")
    return EXIT_PASS if write_pages(root, _policy(args), _native_rows(args), args.check, args.force) else EXIT_FAIL


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
    selection = selection_of(args)
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
    settings = run_settings(args)
    with Run(settings) as run:
        run.cases  # a bad selection: before the output directory is made
        _out_dir(settings.out)
        return run.run_leg(args.backend)


def cmd_causality(args) -> int:
    settings = run_settings(args)
    with Run(settings) as run:
        run.cases
        _out_dir(settings.out)
        return run.check_causality(args.backend)


def cmd_gate(args) -> int:
    from harness.app.selection import result_in

    gate = gate_settings(args)
    run = Run(RunSettings(out=_out_dir(args.out), cache_dir=default_cache_dir(os.environ)))
    baseline = result_in(args.gpu_csv, gate.baseline_leg)
    candidate = result_in(args.tpu_csv, gate.candidate_leg)
    return run.gate_files(baseline, candidate, gate)


def cmd_compile(args) -> int:
    from harness.compile.tpu_compile import COMPILE_DEFAULT_TARGETS, parse_targets

    targets = parse_targets(args.target, COMPILE_DEFAULT_TARGETS)
    check_file_size_limit(targets)
    run = Run(RunSettings(selection=selection_of(args), out=Path(args.out), tag=args.tag, jobs=_jobs(args),
                          progress=not args.no_progress, reference_cache=False,
                          case_timeout=parse_case_timeout(args.case_timeout), cache_dir=default_cache_dir(os.environ)))
    run.cases
    _out_dir(args.out)
    reuse = tuple(Path(p) for text in args.reuse or () for p in text.split(",") if p.strip())
    with run:
        return run.compile_record(args.backend, targets, reuse)


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
    policy = _policy(args)
    settings = run_settings(args)
    _out_dir(args.out)
    with Run(settings) as run:
        if not args.results:
            run.cases
        return run.calibrate(policy, tuple(Path(p) for p in args.results or ()))


def cmd_all(args) -> int:
    """``parity all`` (:meth:`harness.app.session.Run.all`): legs -> causality -> gate -> draws -> report."""
    gate = gate_settings(args)
    settings = run_settings(args)
    with Run(settings) as run:
        run.cases  # a bad selection: before the output directory is made
        _out_dir(settings.out)
        return run.all(gate)


def cmd_bisect(args) -> int:
    """``parity bisect`` (:func:`harness.bisect.session.run_bisection`, docs/bisect.md)."""
    from harness.bisect.session import BisectInterrupted, BisectRequest, run_bisection

    if not args.candidate:
        raise UsageError("give the leg to bisect: --candidate LEG (or --replay LOG)")
    from harness.legs.registry import default_leg
    from harness.run.recipe import LegRecipe

    legs, timeout = _leg_options(args), parse_case_timeout(args.case_timeout)
    recipe, baseline = (LegRecipe.resolve(name, legs.for_leg(name), timeout, impl=tuple(args.impl),
                                          cache_dir=default_cache_dir(os.environ))
                        for name in (args.candidate, default_leg("baseline")))
    cache = Path(args.cache or os.environ.get("PARITY_BISECT_CACHE")
                 or Path.home() / ".cache" / "linear-attn-parity" / "bisect")
    request = BisectRequest(
        candidate=args.candidate, cases=tuple(select_cases(args)), policy=_policy(args), versions=args.versions,
        git=Path(args.git) if args.git else None, commits=args.commits, out=Path(args.out) if args.out else None,
        force=args.force, sweep=args.sweep, good=args.good, bad=args.bad, skip=tuple(args.skip),
        argv=tuple(args.argv), baseline_rows=tuple(Path(p) for p in args.baseline_rows), recipe=recipe,
        baseline_recipe=baseline, cache=cache, uv=args.uv)
    try:
        run_bisection(request)
    except BisectInterrupted as exc:
        raise Interrupted(str(exc)) from None
    return EXIT_PASS


def _parse(parser, argv: list[str]):
    """The arguments, with ``argv`` (the verb's own arguments, as a bisect log keeps them); ``parity bisect
    --replay LOG`` reads as the command its log holds, with its good, bad and skip lines."""
    args = parser.parse_args(argv)
    verb = getattr(args, "verb_fn", None)
    args.argv = argv[argv.index(verb) + 1:] if verb in argv else []
    if verb != "bisect" or not args.replay:
        return args
    from harness.bisect.run import read_log

    logged, marks = read_log(Path(args.replay).read_text(encoding="utf-8"))
    again = parser.parse_args(["bisect", *logged])
    again.replay, again.argv = None, logged
    again.good, again.bad = marks["good"] or again.good, marks["bad"] or again.bad
    again.skip = list(dict.fromkeys([*again.skip, *marks["skip"]]))
    return again


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
    from harness.core.results import ReportError

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        try:
            args = _parse(build_parser(), argv)
        except SystemExit as exc:  # argparse: --help is 0, bad usage is 2
            return int(exc.code or 0)
        for text in getattr(args, "impl", []):
            register_implementation(*parse_impl(text))
        if getattr(args, "backend", None):
            check_implementation(args.backend)  # an unknown leg, or one that does not load: before any work
        return int(VERBS[args.verb_fn](args))
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
