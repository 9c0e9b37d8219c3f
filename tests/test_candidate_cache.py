"""The candidate cache (harness/run/baseline_cache.py, the TPU leg): this project's kernels are served again only
while every source their binding imports from the repository is unchanged, so an edit to one op's kernels
re-runs that op's cases alone, and a served case keeps the compile facts of its clean preflight."""

import os
import pathlib

import numpy as np
import pandas as pd
import pytest

import harness.run.baseline_cache as gc
from cases.inputs import make_inputs
from cases.suites import get_suite
from harness.run.baseline_cache import BaselineCache, source_closure
from harness.legs import make_leg
from harness.ops import REGISTRY as OPS, get_op
from harness.run.reference_cache import ReferenceCache
from harness.core.results import rows_to_frame
from harness.run.runner import Runner

ROOT = gc._ROOT


def _write(root: pathlib.Path, relative: str, text: str) -> pathlib.Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_the_closure_follows_function_level_relative_and_package_imports_within_the_tree(tmp_path):
    entry = _write(tmp_path, "app/binding.py", "import json\n\ndef forward():\n    from kern import op\n")
    _write(tmp_path, "app/settings.py", "import kern.tables\n\nfrom kern import LIMIT\n")
    _write(tmp_path, "app/__init__.py", "")  # a package the binding's own imports pass through: not followed
    _write(tmp_path, "kern/__init__.py", "LIMIT = 3\n")  # a name defined here: the package file is followed
    _write(tmp_path, "kern/tables.py", "")
    _write(tmp_path, "kern/op.py", "from . import shared\nfrom ..outside import x\n")  # beyond the tree: skipped
    _write(tmp_path, "kern/shared.py", "import numpy\n")
    _write(tmp_path, "kern/other.py", "")  # in the package, never imported
    _write(tmp_path, "registry/__init__.py", "from kern import other\n")  # a package nothing imports
    got = {str(p.relative_to(tmp_path)) for p in source_closure([entry], root=tmp_path)}
    assert got == {"app/binding.py", "kern/op.py", "kern/shared.py"}
    got = {str(p.relative_to(tmp_path)) for p in source_closure([tmp_path / "app/settings.py"], root=tmp_path)}
    assert got == {"app/settings.py", "kern/__init__.py", "kern/tables.py"}


def _closure(op_name: str) -> set[str]:
    leg = make_leg("tpu")
    files = [gc.source_file(fn) for fn in leg.sources(get_op(op_name))]
    return {str(p.relative_to(ROOT)) for p in source_closure(files)}


def test_each_ops_key_covers_its_own_kernels_and_the_shared_ones_and_no_other_ops():
    shared = {"kernels_tpu/common.py", "kernels_tpu/mxu.py", "kernels_tpu/varlen.py", "kernels_tpu/interpret.py",
              "kernels_tpu/call_config.py"}
    own = {"simple_gla": "kernels_tpu/simple_gla/", "gla": "kernels_tpu/gla/", "kda": "kernels_tpu/kda/",
           "gdn": "kernels_tpu/gdn/", "gdn2": "kernels_tpu/gdn2/"}
    assert set(own) == set(OPS)
    # gdn runs on kda's kernels with its scalar decay broadcast over K; gdn2's are kda's with two operands changed
    # (its decode kernel is kda's with the erase keys apart); simple_gla's and gla's share only the call's Config
    # and layout (kernels_tpu.call_config) with them
    uses = {"gdn": {"kda"}, "gdn2": {"kda"}}
    for name in OPS:
        closure = _closure(name)
        assert shared <= closure, name
        for other, folder in own.items():
            inside = any(f.startswith(folder) for f in closure)
            assert inside == (other == name or other in uses.get(name, ())), (name, other)


def _edit(monkeypatch, relative: str):
    """Every read of ``relative`` sees it with one more line, as after a one-line edit."""
    target = (ROOT / relative).resolve()
    real = pathlib.Path.read_bytes

    def read_bytes(self):
        data = real(self)
        return data + b"\n# edited\n" if self.resolve() == target else data

    monkeypatch.setattr(pathlib.Path, "read_bytes", read_bytes)


def _keys(tmp_path) -> dict[str, str]:
    cache = BaselineCache(make_leg("tpu"), directory=tmp_path)
    keys = {}
    for name, op in OPS.items():
        case = next(c for c in get_suite("smoke") if c.op == name)
        keys[name] = cache.key(op, case, make_inputs(case, op.inputs(case)))
    return keys


@pytest.mark.parametrize("edited, moved", [
    ("kernels_tpu/kda/chunk.py", {"kda", "gdn", "gdn2"}),
    ("kernels_tpu/delta_rule.py", {"kda", "gdn", "gdn2"}),
    ("kernels_tpu/call_config.py", {"simple_gla", "gla", "kda", "gdn", "gdn2"}),
    ("kernels_tpu/gated_recurrent.py", {"simple_gla", "gla"}),
    ("kernels_tpu/gdn2/chunk.py", {"gdn2"}),
    ("kernels_tpu/simple_gla/fused_chunk.py", {"simple_gla"}),
    ("kernels_tpu/gla/fused.py", {"gla"}),
    ("kernels_tpu/gdn/chunk.py", {"gdn"}),
    ("kernels_tpu/common.py", {"simple_gla", "gla", "kda", "gdn", "gdn2"}),
    ("harness/legs/tpu.py", {"simple_gla", "gla", "kda", "gdn", "gdn2"}),
    ("harness/emulation/dots.py", set()),  # fla's emulation: not the TPU side
    ("harness/judge/gate.py", set()),  # the judging code: rows are rebuilt from served outputs
])
def test_a_one_line_edit_moves_exactly_the_keys_that_depend_on_it(tmp_path, monkeypatch, edited, moved):
    before = _keys(tmp_path)
    assert None not in before.values()
    _edit(monkeypatch, edited)
    after = _keys(tmp_path)
    assert {name for name in OPS if after[name] != before[name]} == moved


def test_the_compile_targets_xla_flags_and_the_dot_policy_are_part_of_the_key(tmp_path, monkeypatch):
    from kernels_tpu import mxu

    case = min(get_suite("smoke"), key=lambda c: (c.B * c.T * c.H * (c.K + c.V), c.id))
    op, inputs = get_op(case.op), make_inputs(case, get_op(case.op).inputs(case))
    base = BaselineCache(make_leg("tpu"), tmp_path).key(op, case, inputs)
    assert BaselineCache(make_leg("tpu", compile_targets=("v5e",)), tmp_path).key(op, case, inputs) != base
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=true")
    assert BaselineCache(make_leg("tpu"), tmp_path).key(op, case, inputs) != base
    monkeypatch.delenv("XLA_FLAGS")
    monkeypatch.setitem(mxu.F32_DOT_PRECISION, "bfloat16", mxu.Precision.HIGHEST)
    assert BaselineCache(make_leg("tpu"), tmp_path).key(op, case, inputs) != base


CASE = min(get_suite("smoke"), key=lambda c: (c.B * c.T * c.H * (c.K + c.V), c.id))


def test_a_served_case_skips_its_run_and_its_compile_and_gives_the_same_rows(tmp_path, monkeypatch):
    leg = make_leg("tpu")
    refs = ReferenceCache(None)
    first = Runner(leg, refs, leg_cache=BaselineCache(leg, tmp_path)).run_case(CASE)
    assert {r["status"] for r in first} == {"ok"} and first[0]["compiled_for"] == "v6e"

    def must_not_run(*args):
        raise AssertionError("a served case ran")

    monkeypatch.setattr(leg, "run", must_not_run)
    monkeypatch.setattr(leg, "preflight", must_not_run)
    cache = BaselineCache(leg, tmp_path)
    served = Runner(leg, refs, leg_cache=cache).run_case(CASE)
    assert cache.hits == 1
    volatile = ["timestamp", "details"]
    pd.testing.assert_frame_equal(rows_to_frame(served).drop(columns=volatile),
                                  rows_to_frame(first).drop(columns=volatile))
    assert all("candidate_cache" in r["details"] for r in served)
    assert cache.summary(1, 1) == f"1/1 cases from the candidate cache ({tmp_path})"


def test_a_case_whose_compile_failed_is_never_stored(tmp_path, monkeypatch):
    leg = make_leg("tpu")
    monkeypatch.setattr(leg, "preflight", lambda op, case, inputs: ("does not compile for TPU v6e: injected", {}))
    rows = Runner(leg, ReferenceCache(None), leg_cache=BaselineCache(leg, tmp_path)).run_case(CASE)
    assert {r["status"] for r in rows} == {"error"}
    assert not list(tmp_path.glob("*.npz"))


@pytest.mark.parametrize("resident, available, frees", [(0.5, 20.0, True), (0.1, 3.5, True), (0.1, 20.0, False)])
def test_the_tpu_leg_frees_compiled_programs_when_the_shapes_change_in_a_full_process(monkeypatch, resident,
                                                                                      available, frees):
    """Each distinct shape's programs would otherwise stay for the life of the process (a 60-shape run ran out
    of memory); the draws of one case keep theirs, and below the memory limits (a quarter of the machine in this
    process, a job's 4 GiB left on the machine) every shape keeps its own (the causality runs reuse them)."""
    import jax

    import harness.legs.tpu as tpu

    cleared = []
    monkeypatch.setattr(jax, "clear_caches", lambda: cleared.append(True))
    monkeypatch.setattr(tpu, "resident_fraction", lambda: resident)
    monkeypatch.setattr(tpu, "available_gib", lambda: available)
    leg = make_leg("tpu")
    other = next(c for c in get_suite("smoke") if c.replace(seed=0).id != CASE.id)
    for case, clears in ((CASE, 0), (CASE.replace(seed=1), 0), (CASE.replace(seed=2), 0), (other, 1),
                         (other, 1), (CASE, 2)):
        leg.start_case(case)
        assert len(cleared) == (clears if frees else 0), case.id


def test_the_memory_readings_follow_an_allocation():
    from harness.core.memory import available_gib, resident_fraction

    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    before, left = resident_fraction(), available_gib()
    assert 0.0 < before < 1.0 and 0.0 < left < physical
    block = np.ones(2**28 // 8)  # 256 MiB, every page written
    assert (resident_fraction() - before) * physical > 0.24
    assert left - available_gib() > 0.2  # other processes may move it too: most of the block shows
    del block


def test_the_runner_starts_a_case_before_its_preflight_thread_and_not_for_a_served_one(tmp_path, monkeypatch):
    leg = make_leg("tpu", compile_targets=())
    calls = []
    real_run = leg.run
    monkeypatch.setattr(leg, "start_case", lambda case: calls.append("start"))
    monkeypatch.setattr(leg, "preflight", lambda op, case, inputs: calls.append("preflight") or (None, {}))
    monkeypatch.setattr(leg, "run", lambda op, case, inputs: calls.append("run") or real_run(op, case, inputs))
    runner = Runner(leg, ReferenceCache(None), leg_cache=BaselineCache(leg, tmp_path))
    runner.run_case(CASE)
    assert calls[0] == "start" and sorted(calls[1:]) == ["preflight", "run"]
    runner.run_case(CASE)  # served: nothing of the leg runs
    assert len(calls) == 3


def test_a_key_names_files_relative_to_the_repository_so_every_clone_computes_it_alike():
    """Committed records (parity compile --reuse, parity ptx --reuse) are verified in CI's fresh clone elsewhere: a
    file's name in a key is its path in the repository, never where the checkout lies."""
    import hashlib

    from harness.core.content_key import file_name as _name, files_digest as _hash_files

    gate, ops = ROOT / "harness/judge/gate.py", ROOT / "harness/ops/base.py"
    assert _name(gate) == "harness/judge/gate.py" and _name(ROOT / "harness" / ".." / "harness/judge/gate.py") == "harness/judge/gate.py"
    want = hashlib.sha256(b"harness/judge/gate.py" + gate.read_bytes() + b"harness/ops/base.py" + ops.read_bytes())
    assert _hash_files([ops, str(gate), gate]) == want.hexdigest()  # sorted by name, each file once
    assert _name("/usr/lib/os.py") == "/usr/lib/os.py"  # outside the repository: its full path
