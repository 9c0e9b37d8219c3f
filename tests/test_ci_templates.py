"""The CI templates in ci/github/: actionlint passes on each (and fails on a broken copy), every ``parity`` and
``pytest`` command line in them parses with the project's own CLI and pytest options, and the files one job
hands to the next have the names the harness writes."""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from harness.cli import selection_of, build_parser
from harness.run.result_file import result_name
from harness.run.runner import parse_shard

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "ci" / "github"
CONFIG = TEMPLATES / "actionlint.yaml"
WORKFLOWS = sorted(TEMPLATES.glob("*.yml"))
EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
SHELL_VAR = re.compile(r"\$\{(\w+)\}|\$(\w+)")


def _actionlint() -> str:
    found = shutil.which("actionlint", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                              os.environ.get("PATH", "")]))
    assert found, "actionlint is not installed: pip install -c .ci/constraints.txt -e '.[test]'"
    return found


def _lint(*files: Path) -> tuple[int, list[dict]]:
    out = subprocess.run([_actionlint(), "-config-file", str(CONFIG), "-format", "{{json .}}", *map(str, files)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode in (0, 1), out.stderr  # 1: problems found; anything else: actionlint itself failed
    return out.returncode, json.loads(out.stdout or "[]")


def test_the_templates_are_there():
    assert {p.name for p in WORKFLOWS} == {"parity-hardware.yml", "parity-emulated.yml", "parity-your-kernels.yml"}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_actionlint_passes(path):
    rc, problems = _lint(path)
    assert (rc, problems) == (0, []), "\n".join(f"{p['line']}:{p['column']} {p['message']}" for p in problems)


BREAKAGES = {
    "unknown job in needs": ("needs: gpu", "needs: gpu_leg", "job-needs"),
    "undefined expression": ("${{ !cancelled() }}", "${{ !cancelled() && matrix.shard }}", "expression"),
    "unknown permission level": ("pull-requests: write", "pull-requests: writ", "permissions"),
    "unknown action input": ("if-no-files-found: error", "if-no-file-found: error", "action"),
    "bad YAML": ("    steps:\n", "    steps:\n  - :\n", "syntax-check"),
}


@pytest.mark.parametrize("name", BREAKAGES)
def test_actionlint_fails_on_a_broken_template(name, tmp_path):
    old, new, kind = BREAKAGES[name]
    text = (TEMPLATES / "parity-hardware.yml").read_text()
    assert old in text
    broken = tmp_path / "parity-hardware.yml"
    broken.write_text(text.replace(old, new, 1))
    rc, problems = _lint(broken)
    assert rc == 1 and kind in {p["kind"] for p in problems}, problems


# ------------------------------------------------------------------------- the command lines in run: steps
def _workflow(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _matrix(job: dict) -> list[dict]:
    """Every combination of the job's matrix (one empty one without a matrix)."""
    matrix = dict((job.get("strategy") or {}).get("matrix") or {})
    assert not {"include", "exclude"} & set(matrix), "extend _matrix for include/exclude"
    keys = sorted(matrix)
    return [dict(zip(keys, values)) for values in itertools.product(*(matrix[k] for k in keys))]


def _expand(text: str, combo: dict, total: int) -> str:
    def value(m):
        expr = m.group(1)
        if expr.startswith("matrix.") and expr[7:] in combo:
            return str(combo[expr[7:]])
        if expr == "strategy.job-total":
            return str(total)
        raise AssertionError(f"a command line uses ${{{{ {expr} }}}}: pass it through env: instead")
    return EXPRESSION.sub(value, text)


def _commands(path: Path, program: str):
    """(job id, step name, env, argv) of every ``program`` command line of every run: step, over the matrix.
    ``${{ matrix.* }}`` is expanded, shell variables are taken from the workflow's, job's and step's ``env:``
    (another variable becomes ``X``: one word, as argparse sees it)."""
    wf = _workflow(path)
    for job_id, job in wf["jobs"].items():
        combos = _matrix(job)
        for combo, step in itertools.product(combos, job["steps"]):
            if "run" not in step:
                continue
            env = {**(wf.get("env") or {}), **(job.get("env") or {}), **(step.get("env") or {})}
            script = _expand(step["run"], combo, len(combos)).replace("\\\n", " ")
            for line in script.splitlines():
                words = shlex.split(line, comments=True)
                if words[:1] != [program]:
                    continue
                words = [SHELL_VAR.sub(lambda m: str(env.get(m.group(1) or m.group(2), "X")), w) for w in words]
                yield job_id, step.get("name", step["run"][:40]), env, words


def _parity(argv: list[str]):
    try:
        return build_parser().parse_args(argv[1:])
    except SystemExit:
        raise AssertionError(f"`{shlex.join(argv)}` does not parse with harness.cli.build_parser") from None


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_parity_commands_parse_with_the_cli(path):
    from cases.suites import get_suite

    commands = list(_commands(path, "parity"))
    assert commands, f"{path.name} runs no parity command"
    for _, _, _, argv in commands:
        args = _parity(argv)
        if getattr(args, "shard", None):
            parse_shard(args.shard)
        if getattr(args, "suite", None):  # parity gate's --suite is optional (a subset of the two files)
            for name in args.suite.split(","):
                assert get_suite(name.strip()), argv


def _pytest_markers() -> set[str]:
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    return {m.split(":")[0].strip() for m in ini["markers"]}


def test_pytest_commands_use_existing_options(tmp_path):
    """Each pytest command line, as written, against this project's pytest configuration and plugin: pytest
    refuses an option it does not know (exit 4); an empty test file keeps collection instant (exit 5)."""
    commands = [c for p in WORKFLOWS for c in _commands(p, "pytest")]
    assert {argv[argv.index("-m") + 1] for *_, argv in commands} == {"gpu", "tpu"}
    (tmp_path / "test_empty.py").write_text("")
    for *_, argv in commands:
        words = set(re.findall(r"\w+", argv[argv.index("-m") + 1])) - {"and", "or", "not"}
        assert words <= _pytest_markers(), argv
        out = subprocess.run([sys.executable, "-m", *argv, "-c", str(ROOT / "pyproject.toml"), "--rootdir",
                              str(tmp_path), "--collect-only", "-q", "test_empty.py"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert out.returncode == 5, f"`{shlex.join(argv)}`:\n{out.stdout}{out.stderr}"


def test_a_misspelt_option_is_caught(tmp_path):
    """The two checks above can fail: a misspelt option of either program is refused."""
    with pytest.raises(AssertionError, match="does not parse"):
        _parity(["parity", "gate", "a.csv", "b.csv", "--junit-xml", "j.xml"])
    (tmp_path / "test_empty.py").write_text("")
    out = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "--parity-suites", "smoke", "-c",
                          str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), "--collect-only", "-q",
                          "test_empty.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 4 and "--parity-suites" in out.stderr


# ------------------------------------------------------------------------- the hand-offs between jobs
def _step(wf: dict, job: str, name_starts: str) -> dict:
    [step] = [s for s in wf["jobs"][job]["steps"] if s.get("name", "").startswith(name_starts)]
    return step


def test_emulated_shards_merge_into_the_gate(tmp_path):
    """The emulated workflow: every shard the matrix runs is one the merge step reads, by the name
    ``parity run --shard`` gives it, and the gate reads what the merge writes. The merge step's own shell
    script runs here, with a ``parity`` that records its arguments."""
    path = TEMPLATES / "parity-emulated.yml"
    wf = _workflow(path)
    shards = wf["jobs"]["legs"]["strategy"]["matrix"]["shard"]
    assert shards == list(range(int(wf["env"]["SHARDS"]))), "SHARDS must count the matrix's shards"
    written = {"gpu": set(), "tpu": set()}
    for job, _, _, argv in _commands(path, "parity"):
        args = _parity(argv)
        if job == "legs":
            assert args.verb == "run" and args.out == "shards"
            written[args.backend].add(selection_of(args).result_name(args.backend, tag=getattr(args, "tag", None)))
    assert all(len(names) == len(shards) for names in written.values()), written

    # the artifacts of every shard, downloaded into one directory (merge-multiple)
    download = _step(wf, "gate", "Download")
    assert download["with"]["merge-multiple"] is True
    upload = _step(wf, "legs", "Upload")
    assert upload["with"]["path"] == "shards/*.csv" and download["with"]["pattern"] == "parity-shard-*"
    assert upload["with"]["name"] == "parity-shard-${{ matrix.shard }}"
    (tmp_path / download["with"]["path"]).mkdir()
    for name in set().union(*written.values()):
        (tmp_path / download["with"]["path"] / name).write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "parity"
    shim.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"open({str(tmp_path / 'calls.jsonl')!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    shim.chmod(0o755)
    merge = _step(wf, "gate", "Merge")
    env = {**os.environ, **{k: str(v) for k, v in wf["env"].items()}, "PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin"}
    subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", merge["run"]], cwd=tmp_path, env=env,
                   check=True, timeout=60)
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    merged = {}
    for argv in calls:
        args = _parity(["parity", *argv])
        assert args.verb == "merge"
        leg = Path(args.output).stem
        assert {Path(p).name for p in args.inputs} == written[leg]
        assert all((tmp_path / p).exists() for p in args.inputs)
        merged[leg] = args.output
    [(_, _, _, gate)] = [c for c in _commands(path, "parity") if c[0] == "gate" and c[3][1] == "gate"]
    args = _parity(gate)
    assert (args.gpu_csv, args.tpu_csv) == (merged["gpu"], merged["tpu"])
    assert _step(wf, "gate", "Upload")["with"]["path"].rstrip("/") == args.out


def test_hardware_gpu_baseline_reaches_the_tpu_job():
    """The hardware workflow: the GPU job uploads the gpu.csv its pytest run writes, the TPU job gates against
    the downloaded copy, and the gate reads the tpu.csv the TPU run writes."""
    path = TEMPLATES / "parity-hardware.yml"
    wf = _workflow(path)
    [gpu_run] = [argv for job, _, _, argv in _commands(path, "pytest") if job == "gpu"]
    [tpu_run] = [argv for job, _, _, argv in _commands(path, "pytest") if job == "tpu"]
    option = lambda argv, name: argv[argv.index(name) + 1]  # noqa: E731
    gpu_csv = f"{option(gpu_run, '--parity-out')}/{result_name('gpu')}"  # as the pytest plugin names it
    upload = _step(wf, "gpu", "Upload")
    assert gpu_csv in upload["with"]["path"].split()
    download = _step(wf, "tpu", "Download")
    assert download["with"]["name"] == upload["with"]["name"]
    baseline = f"{download['with']['path']}/{Path(gpu_csv).name}"
    assert option(tpu_run, "--gpu-results") == baseline
    [(_, _, _, gate)] = [c for c in _commands(path, "parity") if c[0] == "tpu"]
    args = _parity(gate)
    assert (args.gpu_csv, args.tpu_csv) == (baseline, f"{option(tpu_run, '--parity-out')}/{result_name('tpu')}")
    assert f"hashFiles('{args.tpu_csv}')" in _step(wf, "tpu", "Gate")["if"]


def test_your_kernels_gate_against_the_rows_fla_uploads():
    """parity-your-kernels.yml: fla's job (3.11) uploads the gpu.csv its run writes; the candidate's job (3.12, its
    own jax) downloads it and gates the leg's rows against it."""
    path = TEMPLATES / "parity-your-kernels.yml"
    wf = _workflow(path)
    commands = {job: [argv for j, _, _, argv in _commands(path, "parity") if j == job] for job in wf["jobs"]}
    [fla_run] = commands["fla"]
    fla = _parity(fla_run)
    upload, download = _step(wf, "fla", "Upload"), _step(wf, "candidate", "Download")
    assert upload["with"]["path"] == f"{fla.out}/{result_name('gpu')}" and fla.backend == "gpu"
    assert download["with"]["name"] == upload["with"]["name"] and wf["jobs"]["candidate"]["needs"] == "fla"
    run, gate = (_parity(argv) for argv in commands["candidate"])
    leg = wf["env"]["LEG"]
    assert run.backend == leg and gate.candidate_leg == leg
    assert gate.gpu_csv == f"{download['with']['path']}/{result_name('gpu')}"
    assert gate.tpu_csv == f"{run.out}/{result_name(leg)}"
    python = {job: step["with"]["python-version"] for job in ("fla", "candidate")
              for step in wf["jobs"][job]["steps"] if "setup-python" in step.get("uses", "")}
    assert python == {"fla": "3.11", "candidate": "3.12"}
