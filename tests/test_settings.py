"""A run's settings records (harness.app.settings): built once by a front end, frozen, self-checking; and the
rules that keep a run one record (docs/architecture.md): one place builds a runner, nothing below the front reads
a command line."""

import dataclasses
import re
from pathlib import Path

import pytest

from harness.app.selection import Selection
from harness.app.settings import GateSettings, LegOptions, RunSettings
from harness.cli import _gate_settings, _run_settings, build_parser
from harness.core.policy import default_policy

ROOT = Path(__file__).resolve().parents[1]
CASE = "simple_gla.chunk/B1-T80-H1-K128-V128/bf16/g=logsigmoid/16/C64/h0,dht"


def test_each_leg_is_built_with_the_options_of_its_role():
    legs = LegOptions.parse("v5e,v7x", ref_method="chunk", ref_dtype="float32", dot_precision="ieee")
    assert legs.for_leg("ref") == {"method": "chunk", "compute_dtype": "float32"}
    assert legs.for_leg("gpu") == {"dot_precision": "ieee"}
    assert legs.for_leg("tpu") == {"compile_targets": ("v5e", "v7x")}
    assert LegOptions.parse(None).for_leg("tpu") == {"compile_targets": ("v6e",)}  # the emulated leg's default
    # the defaults are the legs' own: a record built with no options builds the legs as make_leg(name) does
    assert LegOptions().for_leg("ref") == {"method": "recurrent", "compute_dtype": "float64"}
    assert LegOptions().for_leg("gpu") == {"dot_precision": None}


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


def test_the_command_line_is_read_once_into_the_records(tmp_path):
    args = build_parser().parse_args(["all", "--case", CASE, "--out", str(tmp_path), "--jobs", "3", "--tag", "t",
                                      "--ref-method", "chunk", "--tpu-targets", "v5e", "--dot-precision", "ieee",
                                      "--no-baseline-cache", "--no-ref-cache", "--no-progress", "--resume",
                                      "--margin", "0", "--alpha", "0", "--max-draws", "3", "--allow-missing"])
    run, gate = _run_settings(args), _gate_settings(args)
    assert run == RunSettings(selection=Selection(suite="smoke", case_ids=(CASE,)), out=tmp_path, tag="t",
                              resume=True, jobs=3, reference_cache=False, read_leg_cache=False,
                              legs=LegOptions(ref_method="chunk", dot_precision="ieee", compile_targets=("v5e",)),
                              progress=False)
    assert (gate.max_draws, gate.allow_missing, gate.policy.alpha, gate.policy.margin("rel_l2")) == (3, True, 0, 0)


def test_one_place_builds_a_runner_and_nothing_below_the_front_reads_a_command_line():
    """Runner(...) appears in harness/ only in harness.run.recipe.LegRecipe.runner; no module but the front's reads
    an argparse namespace or a pytest config."""
    front = {"harness/cli.py", "harness/parser.py", "harness/pytest_plugin.py"}
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


def _line_of(name: str, text: str) -> int:
    return next(n for n, line in enumerate((ROOT / name).read_text().splitlines(), 1) if text in line)


def test_a_recipe_written_as_a_command_line_parses_back_to_the_same_recipe(tmp_path):
    """LegRecipe.command_line is the one place a leg becomes a ``parity run``: its options and case time limit,
    read back by the front (harness.cli._run_settings) and resolved by a run, give the same recipe."""
    from harness.app.session import Run
    from harness.run.recipe import LegRecipe

    legs = LegOptions(ref_method="chunk", ref_dtype="float32", dot_precision="ieee", compile_targets=("v5e", "v7x"))
    for leg in ("ref", "gpu", "tpu"):
        recipe = LegRecipe.resolve(leg, legs.for_leg(leg), 120.0, suite="")
        argv = recipe.command_line("python", [CASE], tmp_path, jobs=2)
        assert argv[:3] == ["python", "-m", "harness.cli"] and argv[-2:] == ["--case", CASE]
        args = build_parser().parse_args(argv[3:])
        assert (args.backend, args.out, args.jobs, args.case) == (leg, str(tmp_path), "2", [CASE])
        with Run(_run_settings(args)) as run:
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
