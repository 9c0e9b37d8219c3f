"""A run's settings records (harness.app.settings): built once by a front end, frozen, self-checking; and the
rules that keep a run one record (docs/architecture.md): one place builds a runner, nothing below the front reads
a command line."""

import dataclasses
import re
from pathlib import Path

import pytest

from harness.app.selection import Selection
from harness.app.settings import GateSettings, LegOptions, RunSettings, environment_grids
from harness.cli import gate_settings, run_settings, build_parser
from harness.core.cache_dir import default_cache_dir
from harness.core.policy import default_policy

ROOT = Path(__file__).resolve().parents[1]
CASE = "simple_gla.chunk/B1-T80-H1-K128-V128/bf16/g=logsigmoid/16/C64/h0,dht"


def test_each_leg_is_built_with_the_options_of_its_role():
    legs = LegOptions.parse("v5e,v7x", ref_method="chunk", ref_dtype="float32", dot_precision="ieee")
    assert legs.for_leg("ref") == {"method": "chunk", "compute_dtype": "float32"}
    assert legs.for_leg("gpu") == {"dot_precision": "ieee", "batched_grid": True}
    assert legs.for_leg("tpu") == {"compile_targets": ("v5e", "v7x"), "batched_grid": True}
    assert LegOptions.parse(None).for_leg("tpu") == {"compile_targets": ("v6e",), "batched_grid": True}  # defaults
    assert LegOptions(pallas_grid="per-program").for_leg("tpu")["batched_grid"] is False
    assert LegOptions(pallas_grid="per-program").for_leg("gpu")["batched_grid"] is True  # each emulated leg its own
    assert LegOptions(triton_grid="per-program").for_leg("gpu")["batched_grid"] is False
    # the defaults are the legs' own: a record built with no options builds the legs as make_leg(name) does
    assert LegOptions().for_leg("ref") == {"method": "recurrent", "compute_dtype": "float64"}
    assert LegOptions().for_leg("gpu") == {"dot_precision": None, "batched_grid": True}


@pytest.mark.parametrize("environ, grids", [
    ({}, {"pallas_grid": "batched", "triton_grid": "batched"}),
    ({"PARITY_TPU_GRID": "per-program", "PARITY_BATCHED_GRID": ""}, {"pallas_grid": "per-program",
                                                                     "triton_grid": "batched"}),
    ({"PARITY_TPU_GRID": " Batched ", "PARITY_BATCHED_GRID": "0"}, {"pallas_grid": "batched",
                                                                    "triton_grid": "per-program"}),
    ({"PARITY_BATCHED_GRID": "per-program"}, {"pallas_grid": "batched", "triton_grid": "per-program"}),
])
def test_the_grids_come_from_the_environment_the_front_hands_over(environ, grids):
    assert environment_grids(environ) == grids
    assert LegOptions(**grids).for_leg("tpu")["batched_grid"] == (grids["pallas_grid"] == "batched")


@pytest.mark.parametrize("environ, message", [
    ({"PARITY_TPU_GRID": "fast"}, "PARITY_TPU_GRID='fast': must be one of batched, per-program"),
    ({"PARITY_BATCHED_GRID": "sometimes"}, "PARITY_BATCHED_GRID='sometimes': must be one of batched, per-program"),
])
def test_a_bad_grid_in_the_environment_is_one_line_naming_it(environ, message):
    with pytest.raises(ValueError, match=message):
        environment_grids(environ)


def test_the_cache_root_is_the_environments_when_handed_it(tmp_path):
    assert default_cache_dir({"PARITY_CACHE_DIR": str(tmp_path)}) == tmp_path
    assert default_cache_dir({"PARITY_CACHE_DIR": ""}) is None  # set empty: no cache
    assert default_cache_dir({}) == Path.home() / ".cache" / "linear-attn-parity"
    assert RunSettings().cache_dir is None  # a record made without the front's answer keeps nothing on disk


@pytest.mark.parametrize("make, message", [
    (lambda: LegOptions(ref_method="exact"), "ref_method='exact' must be one of recurrent, chunk"),
    (lambda: LegOptions(ref_dtype="float16"), "ref_dtype='float16' must be one of float64, float32"),
    (lambda: LegOptions(dot_precision="tf16"), "dot_precision='tf16' must be one of None, tf32, tf32x3, ieee"),
    (lambda: LegOptions.parse("v9"), "unknown TPU target"),
    (lambda: RunSettings(jobs=0), "jobs=0 must be a whole number of cores, at least 1"),
    (lambda: GateSettings(max_draws=0), "--max-draws 0: give at least 1"),
])
def test_a_bad_setting_is_a_one_line_error_when_the_record_is_made(make, message):
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        make()
    assert "\n" not in str(info.value)


def test_the_records_are_frozen_and_the_gate_options_name_each_candidate():
    settings = RunSettings(out="x")
    assert settings.out == Path("x")  # a path, whatever the front passed
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.jobs = 4
    gate = GateSettings(allow_missing=True)
    assert gate.options() == {"allow_missing": True, "baseline_leg": "gpu", "candidate_leg": "tpu"}
    assert gate.options("tops")["candidate_leg"] == "tops"
    assert gate.policy == default_policy()


def test_the_command_line_is_read_once_into_the_records(tmp_path, monkeypatch):
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "c"))  # the environment, read by the front into the records
    monkeypatch.setenv("PARITY_TPU_GRID", "per-program")
    monkeypatch.delenv("PARITY_BATCHED_GRID", raising=False)
    args = build_parser().parse_args(["all", "--case", CASE, "--out", str(tmp_path), "--jobs", "3", "--tag", "t",
                                      "--ref-method", "chunk", "--tpu-targets", "v5e", "--dot-precision", "ieee",
                                      "--no-baseline-cache", "--no-ref-cache", "--no-progress", "--resume",
                                      "--margin", "0", "--alpha", "0", "--max-draws", "3", "--allow-missing"])
    run, gate = run_settings(args), gate_settings(args)
    assert run == RunSettings(selection=Selection(suite="smoke", case_ids=(CASE,)), out=tmp_path, tag="t",
                              resume=True, jobs=3, reference_cache=False, read_leg_cache=False,
                              legs=LegOptions(ref_method="chunk", dot_precision="ieee", compile_targets=("v5e",),
                                              pallas_grid="per-program"),
                              progress=False, cache_dir=tmp_path / "c")
    both = run_settings(build_parser().parse_args(["run", "--backend", "tpu", "--case", CASE, "--grid",
                                                          "batched"])).legs  # --grid wins over the environment
    assert (both.pallas_grid, both.triton_grid) == ("batched", "batched")
    assert (gate.max_draws, gate.allow_missing, gate.policy.alpha, gate.policy.margin("rel_l2")) == (3, True, 0, 0)


def test_one_place_builds_a_runner_and_nothing_below_the_front_reads_a_command_line():
    """Runner(...) appears in harness/ only in harness.run.recipe.LegRecipe.runner; no module but the front's reads
    an argparse namespace or a pytest config."""
    front = FRONT
    built, reads = [], []
    for path in sorted((ROOT / "harness").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if re.search(r"\bRunner\(", code) and not code.lstrip().startswith(("class ", '"', "'")):
                built.append(f"{name}:{n}")
            if name not in front and re.search(r"\bargs\.(?!items\()\w|\bconfig\.option\b|argparse", code):
                reads.append(f"{name}:{n}")
    assert built == [f"harness/run/recipe.py:{_line_of('harness/run/recipe.py', 'return Runner(')}"], built
    assert reads == [], reads


FRONT = {"harness/cli.py", "harness/parser.py", "harness/pytest_plugin.py"}


def _environment_reads(tree) -> list[tuple[int, str]]:
    """(line, variable) for each read of this harness's own settings from the environment in a module's syntax tree:
    ``os.environ[...]``, ``os.environ.get(...)``, ``os.getenv(...)`` of a ``PARITY_``/``GITHUB_`` name (written out
    or a module constant). (The libraries' own variables, which the compile stage sets for libtpu through an
    ``environ`` it is handed, are not this harness's settings.)"""
    import ast

    constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                 and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str) for t in n.targets
                 if isinstance(t, ast.Name)}

    def is_environ(node):
        return isinstance(node, ast.Attribute) and node.attr == "environ"

    def ours(key):
        name = key.value if isinstance(key, ast.Constant) else constants.get(getattr(key, "id", None))
        return isinstance(name, str) and name.startswith(("PARITY_", "GITHUB_")), name

    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Subscript) and is_environ(node.value):
            key = node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args and (
                (node.func.attr == "get" and is_environ(node.func.value)) or node.func.attr == "getenv"):
            key = node.args[0]
        if key is not None and ours(key)[0]:
            found.append((node.lineno, ours(key)[1]))
    return found


def test_the_environment_finder_sees_each_form_of_a_read():
    import ast

    source = ('import os\nNAME = "PARITY_X"\na = os.environ.get(NAME)\nb = os.environ["PARITY_Y"]\n'
              'c = os.getenv("GITHUB_STEP_SUMMARY")\nd = os.environ.get("XLA_FLAGS")\n')
    assert _environment_reads(ast.parse(source)) == [(3, "PARITY_X"), (4, "PARITY_Y"), (5, "GITHUB_STEP_SUMMARY")]


def test_nothing_below_the_front_reads_the_environment_for_a_setting():
    """PARITY_CACHE_DIR, PARITY_TPU_GRID, PARITY_BATCHED_GRID, PARITY_JOBS, GITHUB_STEP_SUMMARY...: read by the front
    (cli.py, the pytest plugin) and handed down in the records; the libraries' own variables (TRITON_*, XLA_FLAGS,
    LIBTPU_INIT_ARGS), which the legs set or record as facts of the process, are not this rule's."""
    import ast

    reads = [f"{path.relative_to(ROOT).as_posix()}:{line} {name}"
             for path in sorted((ROOT / "harness").rglob("*.py")) if path.relative_to(ROOT).as_posix() not in FRONT
             for line, name in _environment_reads(ast.parse(path.read_text()))]
    assert reads == [], reads


def _line_of(name: str, text: str) -> int:
    return next(n for n, line in enumerate((ROOT / name).read_text().splitlines(), 1) if text in line)


def test_a_recipe_written_as_a_command_line_parses_back_to_the_same_recipe(tmp_path):
    """LegRecipe.command_line is the one place a leg becomes a ``parity run``: its options and case time limit,
    read back by the front (harness.cli.run_settings) and resolved by a run, give the same recipe."""
    from harness.app.session import Run
    from harness.run.recipe import LegRecipe

    legs = LegOptions(ref_method="chunk", ref_dtype="float32", dot_precision="ieee", compile_targets=("v5e", "v7x"),
                      pallas_grid="per-program", triton_grid="per-program")
    for leg in ("ref", "gpu", "tpu"):
        recipe = LegRecipe.resolve(leg, legs.for_leg(leg), 120.0, suite="")
        argv = recipe.command_line("python", [CASE], tmp_path, jobs=2)
        assert argv[:3] == ["python", "-m", "harness.cli"] and argv[-2:] == ["--case", CASE]
        args = build_parser().parse_args(argv[3:])
        assert (args.backend, args.out, args.jobs, args.case) == (leg, str(tmp_path), "2", [CASE])
        with Run(run_settings(args)) as run:
            again = run.recipe(leg)
        assert (again.options, again.timeout) == (recipe.options, recipe.timeout), leg
    quiet = LegRecipe.resolve("gpu", LegOptions().for_leg("gpu"))  # an unset option, no time limit: not written
    assert "--dot-precision" not in quiet.command_line("python", [CASE], tmp_path)
    assert "--case-timeout" not in quiet.command_line("python", [CASE], tmp_path)


def test_each_verb_of_the_command_line_is_short_and_hands_over_to_a_run():
    """cli.py holds no stage logic: every verb function is parse -> records -> a method -> exit status, 30 lines at
    most; the sequence of ``parity all`` is the run's (harness.app.session.Run.all), not the front's."""
    import ast

    tree = ast.parse((ROOT / "harness" / "cli.py").read_text())
    verbs = {n.name: n.end_lineno - n.lineno + 1 for n in tree.body
             if isinstance(n, ast.FunctionDef) and n.name.startswith("cmd_")}
    assert len(verbs) >= 12 and all(n <= 30 for n in verbs.values()), verbs
    body = ast.get_source_segment((ROOT / "harness" / "cli.py").read_text(), next(
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "cmd_all"))
    assert "run.all(" in body and ".leg(" not in body and ".gate(" not in body
