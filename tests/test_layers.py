"""The import graph: the layers in pyproject.toml ([tool.importlinter]) hold, and no modules import each other
in a cycle. Checked with import-linter, on the code's real imports (function-level ones included)."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    code = "import sys; from importlinter.cli import lint_imports_command; lint_imports_command()"
    return subprocess.run([sys.executable, "-c", code, "--no-cache"], cwd=cwd, capture_output=True, text=True,
                          env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})


def test_the_project_keeps_its_layers_and_has_no_cycles():
    run = lint_imports(ROOT)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "15 kept, 0 broken" in run.stdout, run.stdout[-2000:]


def test_each_stage_package_has_a_contract_of_its_own():
    """Every package of the harness (and kernels_tpu) is a layers contract's container, or its modules are named by an
    independence or forbidden contract: how a stage's modules may import one another is written down."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    covered = {c for contract in contracts for c in contract.get("containers", ())}
    covered |= {m.rsplit(".", 1)[0] for contract in contracts
                for m in [*contract.get("modules", ()), *contract.get("source_modules", ())]}
    covered |= {m for contract in contracts for m in contract.get("source_modules", ())}
    packages = {"kernels_tpu"} | {f"harness.{p.name}" for p in (ROOT / "harness").iterdir()
                                  if (p / "__init__.py").exists()}
    assert packages - covered == set(), sorted(packages - covered)


def test_an_upward_import_and_a_cycle_break_the_contracts(tmp_path):
    """The same two kinds of contract on a toy project that breaks both: the check can fail."""
    for pkg in ("top", "low"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "low" / "a.py").write_text("def f():\n    from top import ui  # upward\n")
    (tmp_path / "low" / "b.py").write_text("from low import c\n")
    (tmp_path / "low" / "c.py").write_text("from low import b  # a cycle\n")
    (tmp_path / "top" / "ui.py").write_text("")
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent("""
        [tool.importlinter]
        root_packages = ["top", "low"]
        [[tool.importlinter.contracts]]
        name = "layers"
        type = "layers"
        layers = ["top", "low"]
        [[tool.importlinter.contracts]]
        name = "acyclic"
        type = "acyclic_siblings"
        ancestors = ["low"]
    """))
    run = lint_imports(tmp_path)
    assert run.returncode == 1, run.stdout
    assert "0 kept, 2 broken" in run.stdout, run.stdout[-2000:]
    assert "low.a -> top.ui" in run.stdout
