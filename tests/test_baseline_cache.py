"""The baseline cache (harness/run/baseline_cache.py): what the GPU leg returned is served again only while
nothing it depends on has moved, is verified before use, and never holds a failed run.

The GPU leg runs for real once (the smallest smoke case, emulated); every other test serves that
output through a monkeypatched ``run`` that counts its calls, so a test proves a hit by the
run not being called.
"""

import dataclasses
import importlib.util
import json
import shutil
import warnings

import numpy as np
import pandas as pd
import pytest

import harness.emulation
import harness.run.baseline_cache as gc
from cases.inputs import Inputs, inputs_sha256, make_inputs
from cases.suites import get_suite
from harness.cli import main
from harness.run.baseline_cache import BaselineCache, BaselineCacheWarning
from harness.legs.base import LegOutput
from harness.legs.gpu import GpuLeg
from harness.ops import get_op
from harness.ops.base import LegBinding
from harness.run.reference_cache import ReferenceCache
from harness.core.results import rows_to_frame
from harness.run.runner import Runner
from harness.legs import make_leg

pytest_plugins = ["pytester"]

CASE = min(get_suite("smoke"), key=lambda c: (c.B * c.T * c.H * (c.K + c.V), c.id))
OP = get_op(CASE.op)
INPUTS = make_inputs(CASE, OP.inputs(CASE))
REFS = ReferenceCache(None)
VOLATILE = ["timestamp", "details"]  # the run's own time; details gain the "served from the cache" note


@pytest.fixture(scope="module")
def leg():
    return make_leg("gpu")


@pytest.fixture(scope="module")
def real(leg):
    """The GPU leg's real output for CASE."""
    return leg.run(OP, CASE, INPUTS)


def _serve(monkeypatch, target, output):
    """``target.run`` (a leg, or the GpuLeg class) returns ``output``; the returned list records each call's case."""
    calls = []

    def run(*args):  # (self,) op, case, inputs
        calls.append(args[-2].id)
        return output

    monkeypatch.setattr(target, "run", run)
    return calls


def _runner(leg, directory, read=True):
    return Runner(leg, REFS, leg_cache=BaselineCache(leg, directory, read=read))


def _entries(directory):
    return sorted((directory).glob("*.npz")) if directory.exists() else []


def result_frame(rows) -> pd.DataFrame:
    return rows_to_frame(rows).drop(columns=VOLATILE)


@pytest.mark.needs_leg("gpu")
def test_a_hit_gives_the_rows_of_the_run_it_stored(leg, real, tmp_path, monkeypatch):
    calls = _serve(monkeypatch, leg, real)
    fresh = _runner(leg, tmp_path).run_case(CASE)
    assert calls == [CASE.id] and len(_entries(tmp_path)) == 1
    assert {r["status"] for r in fresh} == {"ok"}

    runner = _runner(leg, tmp_path)
    served = runner.run_case(CASE)
    assert calls == [CASE.id], "a hit must not run the leg"
    assert (runner.leg_cache.hits, runner.leg_cache.misses) == (1, 0)
    # every column the gate reads, wall_s included (the original run's time), is the fresh run's
    pd.testing.assert_frame_equal(result_frame(served), result_frame(fresh))
    for f, s in zip(fresh, served):
        note = json.loads(s["details"]).pop("baseline_cache")
        assert note.startswith("served from the cache: computed ") and "baseline_cache" not in json.loads(f["details"])
        assert {k: v for k, v in json.loads(s["details"]).items() if k != "baseline_cache"} == json.loads(f["details"])


@pytest.mark.needs_leg("gpu")
def test_served_arrays_are_bit_identical_and_absent_tensors_stay_absent(leg, real, tmp_path):
    out = LegOutput({**real.tensors, "dnothing": None}, real.details, {"extra": 3})
    cache = BaselineCache(leg, tmp_path)
    assert cache.store(OP, CASE, INPUTS, out, 1.25, "abc123")
    served, wall = BaselineCache(leg, tmp_path).load(OP, CASE, INPUTS)
    assert wall == 1.25 and dict(served.columns) == {"extra": 3}
    assert served.tensors["dnothing"] is None
    for name, a in real.tensors.items():
        b = served.tensors[name]
        assert b.dtype == a.dtype and b.shape == a.shape
        assert b.tobytes() == a.tobytes(), name
    assert "abc123" in served.details["baseline_cache"]


@pytest.mark.needs_leg("gpu")
def test_served_rows_are_judged_by_the_current_comparison_code(leg, real, tmp_path, monkeypatch):
    """Rows are rebuilt from the cached output: a change of the metrics reaches served rows too."""
    _serve(monkeypatch, leg, real)
    before = _runner(leg, tmp_path).run_case(CASE)
    import harness.run.runner as runner_module

    original = runner_module.compare

    def doubled(y, r, dtype):
        m = original(y, r, dtype)
        return {**m, "rel_l2": 2 * m["rel_l2"]} if "rel_l2" in m else m

    monkeypatch.setattr(runner_module, "compare", doubled)
    runner = _runner(leg, tmp_path)
    after = runner.run_case(CASE)
    assert runner.leg_cache.hits == 1
    for b, a in zip(before, after):
        assert a["rel_l2"] == 2 * b["rel_l2"]


# ----------------------------------------------------------------------- the key
def _key(leg, op=OP, case=CASE, inputs=INPUTS):
    return BaselineCache(leg, "unused").key(op, case, inputs)


def _other_inputs():
    arrays = dict(INPUTS.arrays)
    name = sorted(arrays)[0]
    arrays[name] = arrays[name].copy()
    arrays[name].flat[0] += 1
    return Inputs(arrays, inputs_sha256(arrays))


@pytest.mark.needs_leg("gpu")
@pytest.mark.parametrize("package", ["fla-core", "triton", "torch"])
def test_key_changes_with_each_version(leg, monkeypatch, package):
    base = _key(leg)
    versions = harness.emulation.triton_versions()
    monkeypatch.setattr(harness.emulation, "triton_versions", lambda: {**versions, package: versions[package] + "x"})
    assert _key(leg) != base
    monkeypatch.undo()
    assert _key(leg) == base


@pytest.mark.needs_leg("gpu")
def test_key_changes_with_case_inputs_dot_precision_mode_and_device(leg, monkeypatch):
    base = _key(leg)
    assert _key(leg) == base  # deterministic
    assert _key(leg, case=CASE.replace(seed=CASE.seed + 1)) != base
    assert _key(leg, inputs=_other_inputs()) != base
    assert _key(make_leg("gpu", dot_precision="ieee")) != base
    env = leg.environment()
    native = dataclasses.replace(env, mode="native", device="NVIDIA H100 80GB HBM3")
    with monkeypatch.context() as m:
        m.setattr(leg, "environment", lambda: native)
        native_key = _key(leg)
        m.setattr(leg, "environment", lambda: dataclasses.replace(native, device="NVIDIA A100-SXM4-80GB"))
        other_device = _key(leg)
    assert len({base, native_key, other_device}) == 3


def _fingerprints(tmp_path, monkeypatch, leg, parts):
    """``leg``'s sources fingerprint over a copy of ``parts`` of the repository, and a function giving it
    after a one-line edit of one file (the edit is undone after)."""
    for part in parts:
        shutil.copytree(gc._ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(gc, "_ROOT", tmp_path)

    def edited(relative):
        path = tmp_path / relative
        text = path.read_text()
        path.write_text(text + "\n# edited\n")
        try:
            return gc.sources_fingerprint(leg)
        finally:
            path.write_text(text)

    return gc.sources_fingerprint(leg), edited


def test_key_follows_the_emulation_layer_and_the_gpu_leg_but_not_the_tpu_side(tmp_path, monkeypatch):
    base, edited = _fingerprints(tmp_path, monkeypatch, "gpu", ("harness", "cases"))

    for moved in ("harness/emulation/dots.py", "harness/emulation/setup.py", "harness/legs/gpu.py",
                  "harness/legs/base.py", "harness/ops/base.py"):
        assert edited(moved) != base, moved
    for unmoved in ("harness/legs/tpu.py", "harness/compile/tpu_compile.py", "harness/core/metrics.py", "harness/judge/gate.py"):
        assert edited(unmoved) == base, unmoved  # the TPU side and the judging code do not invalidate


def _binding_module(path, extra=""):
    path.write_text("from harness.ops import get_op\n\n\ndef forward(case, t):\n"
                    f"    return get_op({OP.name!r}).fla.forward(case, t)\n{extra}")
    spec = importlib.util.spec_from_file_location(f"gpu_binding_{abs(hash(extra))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.needs_leg("gpu")
def test_key_follows_the_source_of_the_descriptors_gpu_binding(leg, tmp_path):
    base = _key(leg)
    module = _binding_module(tmp_path / "binding.py")
    op = dataclasses.replace(OP, fla=LegBinding(module.forward, OP.fla.supports, OP.fla.describe))
    key = _key(leg, op=op)
    assert key != base
    one = BaselineCache(leg, "unused")  # one cache, two descriptors of the same op name
    assert one.key(OP, CASE, INPUTS) == base and one.key(op, CASE, INPUTS) == key
    _binding_module(tmp_path / "binding.py", extra="# a comment moves the source\n")
    assert _key(leg, op=op) != key
    tpu_changed = dataclasses.replace(OP, pallas=LegBinding(module.forward))
    assert _key(leg, op=tpu_changed) == base


@pytest.mark.needs_leg("gpu")
def test_a_binding_without_source_is_never_cached(leg, real, tmp_path):
    op = dataclasses.replace(OP, fla=LegBinding(dict, OP.fla.supports, OP.fla.describe))  # a builtin: no source
    cache = BaselineCache(leg, tmp_path)
    assert cache.key(op, CASE, INPUTS) is None
    assert not cache.store(op, CASE, INPUTS, real, 1.0)
    assert cache.load(op, CASE, INPUTS) is None and _entries(tmp_path) == []


# ------------------------------------------------------------- what is (not) read
@pytest.mark.needs_leg("gpu")
def test_native_and_emulated_entries_never_serve_each_other(leg, real, tmp_path, monkeypatch):
    native_env = dataclasses.replace(leg.environment(), mode="native", device="NVIDIA H100 80GB HBM3")
    native_out = LegOutput({n: None if a is None else a * 2 for n, a in real.tensors.items()}, real.details)
    with monkeypatch.context() as m:
        m.setattr(leg, "environment", lambda: native_env)
        native = BaselineCache(leg, tmp_path)
    emulated = BaselineCache(leg, tmp_path)
    assert native.store(OP, CASE, INPUTS, native_out, 0.1)
    assert emulated.load(OP, CASE, INPUTS) is None and emulated.misses == 1
    assert emulated.store(OP, CASE, INPUTS, real, 2.0)
    assert len(_entries(tmp_path)) == 2
    got_native, got_emulated = native.load(OP, CASE, INPUTS), emulated.load(OP, CASE, INPUTS)
    assert (got_native[1], got_emulated[1]) == (0.1, 2.0)
    np.testing.assert_array_equal(got_native[0].tensors["o"], native_out.tensors["o"])
    np.testing.assert_array_equal(got_emulated[0].tensors["o"], real.tensors["o"])


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _tamper(path):
    with np.load(path) as data:
        arrays = {n: data[n].copy() for n in data.files}
    name = next(n for n in arrays if n != "__meta__")
    arrays[name].flat[0] ^= 1  # one bit of one value; the metadata (and its checksum) stay as they were
    np.savez(path, **arrays)


def _restamp(path):
    with np.load(path) as data:
        arrays = {n: data[n].copy() for n in data.files}
    meta = json.loads(arrays["__meta__"].tobytes())
    meta["format"] = 0
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(path, **arrays)


def _recolumn(path):
    """What an entry's hit serves besides its arrays edited: the row columns (the TPU targets it says it compiled
    for, the MXU tallies), its arrays untouched."""
    with np.load(path) as data:
        arrays = {n: data[n].copy() for n in data.files}
    meta = json.loads(arrays["__meta__"].tobytes())
    meta["columns"] = {**meta["columns"], "compiled_for": "v7x"}
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(path, **arrays)


@pytest.mark.needs_leg("gpu")
@pytest.mark.parametrize("damage, problem", [(_truncate, "unreadable"), (_tamper, "checksum"),
                                             (_restamp, "cache format 0"),
                                             (_recolumn, r"metadata does not match its checksum \(edited\)")])
def test_a_damaged_entry_is_recomputed_and_replaced(leg, real, tmp_path, monkeypatch, damage, problem):
    calls = _serve(monkeypatch, leg, real)
    fresh = _runner(leg, tmp_path).run_case(CASE)
    (entry,) = _entries(tmp_path)
    damage(entry)
    with pytest.warns(BaselineCacheWarning, match=problem):
        again = _runner(leg, tmp_path).run_case(CASE)
    assert len(calls) == 2  # recomputed
    pd.testing.assert_frame_equal(result_frame(again).drop(columns="wall_s"), result_frame(fresh).drop(columns="wall_s"))
    runner = _runner(leg, tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BaselineCacheWarning)
        runner.run_case(CASE)  # the replaced entry is a clean hit
    assert runner.leg_cache.hits == 1 and len(calls) == 2


@pytest.mark.needs_leg("gpu")
def test_failed_runs_are_not_cached(leg, real, tmp_path, monkeypatch):
    def crash(op, case, inputs):
        raise RuntimeError("device lost")

    monkeypatch.setattr(leg, "run", crash)
    rows = _runner(leg, tmp_path).run_case(CASE)
    assert {r["status"] for r in rows} == {"error"} and _entries(tmp_path) == []

    nan = {n: None if a is None else a.copy() for n, a in real.tensors.items()}
    nan["o"].flat[0] = np.nan
    monkeypatch.setattr(leg, "run", lambda op, case, inputs: LegOutput(nan, real.details))
    rows = _runner(leg, tmp_path).run_case(CASE)
    assert "nonfinite" in {r["status"] for r in rows} and _entries(tmp_path) == []

    monkeypatch.setattr(leg, "run", lambda op, case, inputs: real)
    rows = _runner(leg, tmp_path).run_case(CASE)
    assert {r["status"] for r in rows} == {"ok"} and len(_entries(tmp_path)) == 1


@pytest.mark.needs_leg("gpu")
def test_an_unwritable_directory_never_fails_a_run(leg, real, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory should be")
    _serve(monkeypatch, leg, real)
    rows = _runner(leg, blocker / "baselines").run_case(CASE)
    assert {r["status"] for r in rows} == {"ok"}


# ------------------------------------------------------------------------ the CLI
@pytest.fixture
def cli(tmp_path, monkeypatch, real):
    """``cli(*args)`` -> (exit code, stdout) of a GPU run with the cache under tmp_path; ``calls`` counts runs."""
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "cache"))
    calls = _serve(monkeypatch, GpuLeg, real)
    counter = iter(range(100))

    def run(verb, *extra):
        out = tmp_path / f"out{next(counter)}"
        code = main([verb, "--backend", "gpu", "--case", CASE.id, "--out", str(out), "--no-progress", *extra])
        return code, out

    run.calls = calls
    return run


@pytest.mark.needs_leg("gpu")
def test_parity_run_reuses_the_cache_says_so_and_no_baseline_cache_recomputes(cli, capsys, tmp_path):
    where = tmp_path / "cache" / "baselines"
    code, first = cli("run")
    assert code == 0 and len(cli.calls) == 1
    assert f"gpu: 0/1 cases from the baseline cache ({where})" in capsys.readouterr().out
    code, second = cli("run")
    assert code == 0 and len(cli.calls) == 1
    assert f"gpu: 1/1 cases from the baseline cache ({where})" in capsys.readouterr().out
    a, b = (pd.read_csv(next(d.glob("gpu*.csv")), keep_default_na=False) for d in (first, second))
    pd.testing.assert_frame_equal(a.drop(columns=VOLATILE), b.drop(columns=VOLATILE))
    (entry,) = _entries(where)
    inode = entry.stat().st_ino
    code, _ = cli("run", "--no-baseline-cache")
    assert code == 0 and len(cli.calls) == 2
    assert "1 cases recomputed, not read from the baseline cache; entries rewritten" in capsys.readouterr().out
    assert entry.stat().st_ino != inode  # rewritten (a new file renamed over the old one)


@pytest.mark.needs_leg("gpu")
def test_parity_causality_reuses_the_cache(cli, capsys):
    code, first = cli("causality")
    runs = len(cli.calls)
    assert code == 0 and runs >= 2  # the case's inputs, and the perturbed ones
    assert f"gpu causality: 0/{runs} runs from the baseline cache" in capsys.readouterr().out
    code, second = cli("causality")
    assert code == 0 and len(cli.calls) == runs
    assert f"gpu causality: {runs}/{runs} runs from the baseline cache" in capsys.readouterr().out
    # a --case run names its check file like its result file: causality-gpu.cases-<hash>.csv
    pd.testing.assert_frame_equal(*(pd.read_csv(next(d.glob("causality-gpu.cases-*.csv"))) for d in (first, second)))
    code, _ = cli("causality", "--no-baseline-cache")
    assert code == 0 and len(cli.calls) == 2 * runs


@pytest.mark.needs_leg("gpu")
def test_an_empty_cache_dir_setting_turns_the_cache_off(cli, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PARITY_CACHE_DIR", "")
    for _ in range(2):
        assert cli("run")[0] == 0
    assert len(cli.calls) == 2
    assert "baseline cache off" in capsys.readouterr().out
    assert not (tmp_path / "cache").exists()


# -------------------------------------------------------------- the pytest plugin
PLUGIN_INLINE = '''
def test_caches(parity_runner):
    for leg in ("gpu", "ref", "tpu"):
        cache = parity_runner(leg).leg_cache
        print("LEG_CACHE", leg, None if cache is None else (cache.directory, cache.read))
'''


@pytest.mark.needs_leg("gpu")
@pytest.mark.parametrize("flag, read", [((), True), (("--parity-no-baseline-cache",), False)])
def test_the_pytest_plugins_gpu_runner_uses_the_cache(leg, pytester, monkeypatch, tmp_path, flag, read):
    """(``leg``: torch and fla are imported before pytester snapshots the modules.)"""
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "c"))
    pytester.makepyfile(test_inline=PLUGIN_INLINE)
    result = pytester.runpytest("-s", "-p", "no:cacheprovider", *flag)
    result.assert_outcomes(passed=1)
    where = tmp_path / "c" / "baselines"
    result.stdout.fnmatch_lines([f"*LEG_CACHE gpu ({where!r}, {read})", f"LEG_CACHE ref ({where!r}, {read})",
                                 f"LEG_CACHE tpu ({where!r}, {read})"])  # the TPU leg by its sources' closure



@pytest.mark.needs_leg("gpu")
def test_the_reference_legs_key_follows_the_references_not_fla_nor_the_tpu_side(tmp_path, monkeypatch):
    """The reference leg is the other cached baseline: its entries move with references/, op_contract/ and the
    input conversion, and not with fla's emulation layer or the TPU leg."""
    from harness.legs import make_leg

    base, edited = _fingerprints(tmp_path, monkeypatch, "ref", ("harness", "cases", "references", "op_contract"))

    for moved in ("references/simple_gla.py", "references/_varlen.py", "op_contract/ops.py", "cases/inputs.py",
                  "harness/legs/ref.py"):
        assert edited(moved) != base, moved
    for unmoved in ("harness/emulation/dots.py", "harness/legs/gpu.py", "harness/legs/tpu.py", "harness/core/metrics.py"):
        assert edited(unmoved) == base, unmoved
    ref = BaselineCache(make_leg("ref"), directory=tmp_path / "c")
    assert ref.key(OP, CASE, INPUTS) not in (None, BaselineCache(make_leg("gpu"), directory=tmp_path / "c").key(
        OP, CASE, INPUTS))


def test_a_bindings_source_file_is_found_through_partials_and_wrappers():
    """A served descriptor wraps its op's functions with ``functools.wraps``; one of them may be a
    ``functools.partial`` (gdn2's ``differentiable``: delta_rule's with gdn2's gates). inspect.unwrap stops at the
    partial, which has no source file: gdn2's binding then had no fingerprint, so none of its rows were cached and
    no compile record of it could be reused."""
    import functools

    from harness.ops import get_op
    from harness.ops import delta_rule

    def wrapper(case):
        return None

    part = functools.partial(delta_rule.differentiable, gates=("b", "w"))
    wrapped = functools.wraps(part)(wrapper)
    assert gc.source_file(wrapped) == gc.source_file(part) == delta_rule.__file__
    assert gc.source_file(functools.partial(wrapped)) == delta_rule.__file__
    for name in ("simple_gla", "gla", "kda", "gdn", "gdn2"):
        assert gc.binding_fingerprint(get_op(name), make_leg("tpu")) is not None, name
