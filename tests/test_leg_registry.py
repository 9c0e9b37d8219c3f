"""The leg registry is the one place a leg is named: ``harness/`` outside it spells no leg's name."""

import ast
from pathlib import Path

import pytest

from harness.run.baseline_cache import cached
from harness.legs import make_leg
from harness.legs.registry import BUILTIN, default_leg, leg_spec, role_of

HARNESS = Path(__file__).resolve().parents[1] / "harness"
BUILTIN_NAMES = {spec.name for spec in BUILTIN}


def _platform_argument(parent: ast.AST, node: ast.AST, parents: dict) -> bool:
    """A jax *platform* string ("tpu" is also a jax backend): ``jax.devices("tpu")``, ``platform="tpu"``, or an
    element of the tuple ``PLATFORMS = ("tpu", "gpu")`` (what an implementation's kernels are built for)."""
    if isinstance(parent, ast.keyword):
        return parent.arg == "platform"
    if isinstance(parent, ast.Tuple) and isinstance(parents.get(parent), ast.Assign):
        return [getattr(t, "id", None) for t in parents[parent].targets] == ["PLATFORMS"]
    return (isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute)
            and parent.func.attr == "devices" and node in parent.args)


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def leg_literals(path: Path, root: Path = HARNESS.parent) -> list[str]:
    """Where ``path`` spells a built-in leg's name as a string: a whole constant, not prose, not a jax platform,
    not an argparse help text."""
    tree = ast.parse(path.read_text())
    docs, found = _docstrings(tree), []
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and node.value in BUILTIN_NAMES) or id(node) in docs:
            continue
        parent = parents.get(node)
        if _platform_argument(parent, node, parents) or (isinstance(parent, ast.keyword) and parent.arg == "help"):
            continue
        found.append(f"{path.relative_to(root)}:{node.lineno}: {node.value!r}")
    return found


def test_the_scan_finds_a_leg_literal(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('"""the gpu leg, in prose"""\nimport jax\n\nLEG = "gpu"\nDEV = jax.devices("tpu")\n'
                     'p.add_argument("--x", help="ref")\nif leg == "ref":\n    pass\n'
                     'PLATFORMS = ("tpu", "gpu")\nLEGS = ("tpu", "gpu")\n')
    assert leg_literals(probe, tmp_path) == ["probe.py:4: 'gpu'", "probe.py:7: 'ref'", "probe.py:10: 'tpu'",
                                             "probe.py:10: 'gpu'"]


def test_outside_the_registry_harness_names_no_leg():
    registry = HARNESS / "legs" / "registry.py"
    found = [hit for path in sorted(HARNESS.rglob("*.py")) if path != registry for hit in leg_literals(path)]
    assert not found, "leg names belong in harness/legs/registry.py:\n" + "\n".join(found)


def test_a_built_leg_carries_its_registered_name_and_role():
    for spec in BUILTIN:
        if spec.missing() is None:
            assert make_leg(spec.name).name == spec.name
        assert role_of(spec.name) == spec.role
    assert role_of("a-team-kernel-from-another-machine") == "candidate"
    assert {default_leg(role) for role in ("reference", "baseline", "candidate")} == BUILTIN_NAMES


def test_the_builtin_legs_are_cached_and_an_external_candidate_never_is():
    """The baselines, and this project's TPU kernels keyed by every source they import
    (tests/test_candidate_cache.py); another team's kernels have no sources here to key them by."""
    for spec in BUILTIN:
        assert cached(spec.name), spec.name
    assert not cached("a-team-kernel")


@pytest.mark.parametrize("spec", BUILTIN, ids=lambda s: s.name)
def test_a_cached_legs_sources_exist(spec):
    for pattern in leg_spec(spec.name).cache_sources:
        assert list(HARNESS.parent.glob(pattern)), f"{spec.name}: {pattern} matches no file"
