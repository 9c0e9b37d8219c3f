"""No module reaches into another module of this repository by a private name (``_x``): what one module offers
another is public, and a name with a leading underscore is its own module's business (docs/architecture.md).

Two forms are checked: ``from <ours> import _x`` in every Python file of the repository (tests included), and
``<module of ours>._x`` in every file but the tests, which may patch a module's state from the test side.
Third-party private names (jax's, Triton's interpreter) are not this rule's: the emulation and the Pallas
interpreters patch them on purpose, each where it says why."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OURS = ("harness", "cases", "kernels_tpu", "references", "op_contract", "peers", "benchmarks", "reports", "tests")
"""The repository's top-level packages and script folders (pyproject's import-linter roots, and the rest)."""


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _ours(module: str | None, level: int, test_modules: set[str]) -> bool:
    """Whether an import's module is this repository's: relative, under one of :data:`OURS`, or a test module."""
    return level > 0 or (module or "").split(".")[0] in OURS or module in test_modules


def private_reaches(source: str, test_modules: frozenset[str] = frozenset(), attributes: bool = True) -> list[str]:
    """Each ``from <ours> import _x`` (and, with ``attributes``, each ``<alias of ours>._x``) in ``source``, as
    ``line: text``."""
    tree = ast.parse(source)
    found, aliases = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and _ours(node.module, node.level, test_modules):
            found += [f"{node.lineno}: from {'.' * node.level}{node.module or ''} import {a.name}"
                      for a in node.names if _private(a.name)]
            aliases |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            aliases |= {a.asname or a.name.split(".")[0] for a in node.names
                        if _ours(a.name, 0, test_modules)}
    if attributes:
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases):
                found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return sorted(set(found), key=lambda s: int(s.split(":")[0]))


def test_the_finder_sees_both_forms_and_leaves_other_libraries_alone():
    source = ("from harness.run.runner import _short, public\nfrom .chunk import _cfg\nimport kernels_tpu.kda.chunk as kc\n"
              "from jax._src import core\nfrom triton.runtime import interpreter as interp\n"
              "x = kc._helper\ny = interp._patch_lang\nz = core._private\nfrom helpers_mod import _h\n")
    assert private_reaches(source, frozenset({"helpers_mod"})) == [
        "1: from harness.run.runner import _short", "2: from .chunk import _cfg", "6: kc._helper",
        "9: from helpers_mod import _h"]
    assert private_reaches(source, attributes=False) == ["1: from harness.run.runner import _short",
                                                         "2: from .chunk import _cfg"]


def test_no_module_reaches_into_another_by_a_private_name():
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    test_modules = frozenset(Path(f).stem for f in files if f.startswith("tests/"))
    reaches = [f"{f}:{hit}" for f in files
               for hit in private_reaches((ROOT / f).read_text(), test_modules, attributes=not f.startswith("tests/"))]
    assert reaches == [], reaches
