"""pytest integration: ``pytest -m gpu`` and ``pytest -m tpu`` as CI gates.

- A test that takes the ``parity_case`` fixture is parametrized over the
  suite chosen by ``--parity-suite`` (or ``$PARITY_SUITE``, default smoke),
  one test per case, with the case id as the test id. ``--parity-case ID``
  (repeatable) and ``--parity-cases-file TOML`` (``$PARITY_CASES_FILE``; see
  ``cases.case_file``) choose cases one by one instead, suite cases or your own,
  as ``parity run --case/--cases-file`` do; their result files are named as
  that run's (``<leg>.cases-<hash>.csv``). Suites joined with commas, ``--parity-draws N`` and
  ``--parity-shard i/n`` select as ``parity run --suite a,b --draws N --shard i/n``: both front ends
  ask :class:`harness.app.Selection`.
- ``parity_results`` collects rows per leg; at the end of the session they
  are written to ``--parity-out`` (``$PARITY_OUT``, default
  ``reports/runs/pytest``) as ``<leg>.csv`` (``<leg>.op-<ops>.csv`` with
  ``--parity-op``), under the same rules as ``parity run``: locked, and never
  over a result of another suite or leg (then ``<leg>.<run id>.csv``, said in
  the terminal). Under xdist each worker writes a part file tagged with the
  session's run id and the controller merges them.
- ``gpu_baseline`` loads the GPU result file given by ``--gpu-results`` or
  ``$PARITY_GPU_RESULTS``; TPU tests skip, saying so, when it is absent.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

_PARTS = ".parts"


def pytest_addoption(parser):
    group = parser.getgroup("parity", "linear-attention parity harness")
    group.addoption("--parity-suite", default=os.environ.get("PARITY_SUITE", "smoke"),
                    help="suite for gpu/tpu-marked tests, or several joined with commas (env PARITY_SUITE; "
                         "default smoke)")
    group.addoption("--parity-case", action="append", default=[], metavar="ID",
                    help="run just this case (repeatable; overrides --parity-suite): a suite case's id or any "
                         "well-formed case id of your own")
    group.addoption("--parity-cases-file", default=os.environ.get("PARITY_CASES_FILE"), metavar="TOML",
                    help="run the cases of this TOML file (env PARITY_CASES_FILE; overrides --parity-suite, adds "
                         "to --parity-case); see cases/examples/my_cases.toml")
    group.addoption("--parity-op", action="append", default=[],
                    help="keep only cases of this op, or of several joined by commas (repeatable)")
    group.addoption("--parity-draws", type=int, default=int(os.environ.get("PARITY_DRAWS", "1")), metavar="N",
                    help="run each case over N input draws, seeds 0..N-1 (env PARITY_DRAWS; default 1)")
    group.addoption("--parity-shard", default=os.environ.get("PARITY_SHARD"), metavar="i/n",
                    help="run only shard i of n of the cases, as `parity run --shard` (env PARITY_SHARD)")
    group.addoption("--parity-out", default=os.environ.get("PARITY_OUT", str(Path("reports") / "runs" / "pytest")),
                    help="directory for the legs' result CSVs (env PARITY_OUT)")
    group.addoption("--gpu-results", default=os.environ.get("PARITY_GPU_RESULTS"),
                    help="GPU result CSV the tpu-marked tests gate against (env PARITY_GPU_RESULTS)")
    group.addoption("--parity-policy", default=os.environ.get("PARITY_POLICY"),
                    help="policy file of the eps_TPU <= eps_GPU rule (env PARITY_POLICY; default: the shipped, "
                         "calibrated harness/policy.toml)")
    group.addoption("--parity-margin", type=float,
                    default=float(os.environ["PARITY_MARGIN"]) if os.environ.get("PARITY_MARGIN") else None,
                    help="one relative margin for every metric, replacing the policy's (env PARITY_MARGIN)")
    group.addoption("--parity-tpu-targets", default=os.environ.get("PARITY_TPU_TARGETS"),
                    help="real TPU targets the emulated TPU leg compiles each case for first "
                         "(env PARITY_TPU_TARGETS; default v6e)")
    group.addoption("--parity-gate-metrics", default=os.environ.get("PARITY_GATE_METRICS"),
                    help="metrics the tpu-marked tests gate, replacing the policy's (env PARITY_GATE_METRICS)")
    group.addoption("--parity-impl", action="append", default=[], metavar="NAME=module:object",
                    help="register an implementation as the candidate leg NAME (harness.legs.external; "
                         "repeatable; installed ones register themselves through an entry point)")
    group.addoption("--parity-candidate", default=os.environ.get("PARITY_CANDIDATE"), metavar="LEG",
                    help="the leg the tpu-marked tests run and gate against the GPU results (env "
                         "PARITY_CANDIDATE; default: this project's TPU kernels)")
    group.addoption("--parity-no-baseline-cache", action="store_true",
                    help="run the GPU leg again instead of reusing the baseline cache (harness/run/baseline_cache.py)")


def pytest_configure(config):
    from harness.legs import default_leg, leg_spec, parse_impl, register_implementation
    from harness.legs.registry import check_implementation

    # the markers are named for the registry's built-in baseline and candidate legs: ``pytest -m gpu``, ``-m tpu``
    config.addinivalue_line("markers", f"{default_leg('baseline')}: run the baseline leg over a suite, one test "
                                       f"per case")
    config.addinivalue_line("markers", f"{default_leg('candidate')}: run the candidate leg and enforce "
                                       f"eps_TPU <= eps_GPU")
    config.addinivalue_line("markers", "slow: heavier emulated tests, excluded by default")
    workerinput = getattr(config, "workerinput", None)
    config._parity_run_id = workerinput["parity_run_id"] if workerinput else uuid.uuid4().hex[:12]
    config._parity_rows = {}

    try:
        for text in config.option.parity_impl:
            register_implementation(*parse_impl(text))
        config.option.parity_candidate = config.option.parity_candidate or default_leg("candidate")
        if leg_spec(config.option.parity_candidate).role != "candidate":
            raise ValueError(f"--parity-candidate {config.option.parity_candidate} is the "
                             f"{leg_spec(config.option.parity_candidate).role} leg, not a candidate")
        check_implementation(config.option.parity_candidate)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    if selection_of(config).by_id:  # a bad id or case file stops the session at once, one line, not at collection
        _selected_cases(config)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):  # xdist controller -> workers: share one run id
    node.workerinput["parity_run_id"] = node.config._parity_run_id


def selection_of(config):
    """The session's selection, as ``parity run`` makes it (:class:`harness.app.Selection`)."""
    from harness.app import Selection

    opts = config.option
    cases_files = (opts.parity_cases_file,) if opts.parity_cases_file else ()
    return Selection(suite=opts.parity_suite, case_ids=tuple(opts.parity_case), cases_files=cases_files,
                     ops=tuple(opts.parity_op), draws=opts.parity_draws, shard=opts.parity_shard)


def _selected_cases(config) -> list:
    """The session's cases (computed once); a bad id, file, suite or shard stops the session with one line."""
    cached = getattr(config, "_parity_cases", None)
    if cached is None:
        try:
            cached = config._parity_cases = selection_of(config).cases()
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    return cached


def pytest_generate_tests(metafunc):
    if "parity_case" not in metafunc.fixturenames:
        return
    cases = _selected_cases(metafunc.config)
    metafunc.parametrize("parity_case", cases, ids=[c.id for c in cases])


class ParityResults:
    """Rows per leg, written at session end."""

    def __init__(self, config):
        self.config = config

    def add(self, leg: str, rows: list[dict]) -> None:
        self.config._parity_rows.setdefault(leg, []).extend(rows)


@pytest.fixture(scope="session")
def parity_results(request) -> ParityResults:
    return ParityResults(request.config)


def _settings(config):
    """The session's run and gate settings (:mod:`harness.app.settings`), built once from its options; a bad
    value stops the session with one line."""
    cached = getattr(config, "_parity_settings", None)
    if cached is None:
        from harness.app.settings import GateSettings, LegOptions, RunSettings, environment_grids
        from harness.core.cache_dir import default_cache_dir
        from harness.core.policy import policy_from_options

        opts = config.option
        try:
            legs = LegOptions.parse(opts.parity_tpu_targets, **environment_grids(os.environ))
        except ValueError as exc:
            raise pytest.UsageError(f"--parity-tpu-targets: {exc}") from None
        try:
            policy = policy_from_options(opts.parity_policy, opts.parity_gate_metrics, opts.parity_margin)
            cached = config._parity_settings = (
                RunSettings(selection=selection_of(config), out=Path(opts.parity_out), legs=legs,
                            read_leg_cache=not opts.parity_no_baseline_cache, progress=False,
                            cache_dir=default_cache_dir(os.environ)),
                GateSettings(policy=policy, candidate_leg=opts.parity_candidate))
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    return cached


@pytest.fixture(scope="session")
def parity_run(request):
    """The session's :class:`harness.app.session.Run`, over its settings: the one place its legs' recipes are
    resolved and their runners built, as for ``parity run``."""
    from harness.app.session import Run

    with Run(_settings(request.config)[0], say=lambda line: None) as run:
        yield run


@pytest.fixture(scope="session")
def reference_cache(parity_run):
    return parity_run.reference_cache


@pytest.fixture(scope="session")
def parity_runner(parity_run):
    """``parity_runner(leg)`` -> a Runner for that leg, built once per session from the run's recipe (a cached
    leg's with its cache; every candidate compiles for real TPUs first)."""
    from harness.run.runner import Runner

    runners = {}

    def get(leg: str) -> Runner:
        if leg not in runners:
            runners[leg] = parity_run.runner(parity_run.recipe(leg))
        return runners[leg]

    return get


@pytest.fixture(scope="session")
def parity_candidate(request) -> str:
    """The candidate leg of the tpu-marked tests: ``tpu`` (this project's kernels) unless --parity-candidate."""
    return _settings(request.config)[1].candidate_leg


@pytest.fixture(scope="session")
def parity_policy(request):
    return _settings(request.config)[1].policy


@pytest.fixture(scope="session")
def gpu_baseline(request):
    path = request.config.option.gpu_results
    if not path:
        pytest.skip("no GPU result file: pass --gpu-results PATH or set PARITY_GPU_RESULTS "
                    "(make one with `pytest -m gpu` or `parity run --backend gpu`)")
    if not Path(path).exists():
        pytest.skip(f"GPU result file {path!r} does not exist")
    from harness.core.results import read_results

    return read_results(Path(path))


def pytest_sessionfinish(session, exitstatus):
    from harness.core.results import merge_results, rows_to_frame, write_csv

    config = session.config
    out = Path(config.option.parity_out)
    run_id = config._parity_run_id
    worker = getattr(config, "workerinput", None)
    if worker is not None:  # an xdist worker: leave a part for the controller
        for leg, rows in config._parity_rows.items():
            write_csv(rows_to_frame(rows), out / _PARTS / f"{leg}.{run_id}.{worker['workerid']}.csv")
        return
    for leg, rows in config._parity_rows.items():
        write_csv(rows_to_frame(rows), out / _PARTS / f"{leg}.{run_id}.main.csv")
    parts_dir = out / _PARTS
    if not parts_dir.exists():
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    legs = {p.name.split(".")[0] for p in parts_dir.glob(f"*.{run_id}.*.csv")}
    for leg in sorted(legs):
        parts = sorted(parts_dir.glob(f"{leg}.{run_id}.*.csv"))
        path = _write_result(merge_results(parts), out, leg, config, run_id)
        for p in parts:
            p.unlink()
        if reporter is not None:
            reporter.write_line(f"parity: {leg} results -> {path}")
            forward_only, no_gradient = uncompared_rows(path)
            if forward_only:
                reporter.write_line(f"parity: {leg} is FORWARD ONLY: {forward_only} gradient row(s) were not "
                                    f"compared; its PASS covers the forward tensors only", yellow=True, bold=True)
            if no_gradient:
                reporter.write_line(f"parity: {leg} gives NO GRADIENT BY DESIGN in {no_gradient} row(s), as its "
                                    f"bindings declare: not compared; its PASS does not cover them",
                                    yellow=True, bold=True)
    if not any(parts_dir.iterdir()):
        parts_dir.rmdir()


def uncompared_rows(path: Path) -> tuple[int, int]:
    """(gradient rows a forward-only candidate did not give, gradient rows its bindings declare absent by design)."""
    import pandas as pd

    from harness.core.status import FORWARD_ONLY, NO_GRADIENT

    # read as text, an empty cell as "": a file whose reasons are all empty would otherwise be a float column
    reasons = pd.read_csv(path, usecols=["reason"], dtype=str, keep_default_na=False)["reason"]
    return int(reasons.str.startswith(FORWARD_ONLY).sum()), int(reasons.str.startswith(NO_GRADIENT).sum())


def _write_result(df, out: Path, leg: str, config, run_id: str) -> Path:
    """The session's result file, under ``parity run``'s rules (:mod:`harness.run.result_file`); where those
    refuse (another run writes it, or it holds another suite's result) the rows go to a file of their own."""
    from harness.core.results import ReportError, write_csv
    from harness.run.result_file import ResultFile

    selection = selection_of(config)
    path = out / selection.result_name(leg, cases=_selected_cases(config))
    try:
        with ResultFile(path, {"leg": leg, "suite": selection.suite_label}):
            return write_csv(df, path)
    except ReportError as exc:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"parity: not writing {path}: {exc}")
        return write_csv(df, path.with_name(f"{path.stem}.{run_id}.csv"))
