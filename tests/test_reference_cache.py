"""The on-disk golden cache verifies every entry: a bad one is recomputed, replaced and warned about, never used."""

import dataclasses
import warnings

import numpy as np
import pytest

import harness.run.reference_cache as rc
from cases.case import Case
from cases.inputs import make_inputs
from harness.ops import get_op
from harness.run.reference_cache import ReferenceCache, ReferenceCacheWarning
from harness.run.runner import Runner
from harness.legs import make_leg

CASE = Case("simple_gla", "chunk", B=1, T=16, H=1, K=8, V=8, dtype="float32", chunk_size=16)
OP = get_op(CASE.op)
INPUTS = make_inputs(CASE, OP.inputs(CASE))
FRESH = ReferenceCache(None).get(OP, CASE, INPUTS)


def _entry(tmp_path):
    """A good entry on disk; returns its path."""
    cache = ReferenceCache(tmp_path)
    cache.get(OP, CASE, INPUTS)
    return cache._path(cache.key(CASE, INPUTS))


def _read(path):
    with np.load(path) as data:
        return {name: data[name] for name in data.files}


def _assert_fresh(result):
    assert set(result) == set(FRESH)
    for name, a in result.items():
        assert a.dtype == np.float64
        np.testing.assert_array_equal(a, FRESH[name])


def _assert_hit(tmp_path):
    """A new cache instance loads the (replaced) entry as a verified hit, without a warning."""
    cache = ReferenceCache(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReferenceCacheWarning)
        _assert_fresh(cache.get(OP, CASE, INPUTS))
    assert (cache.hits, cache.misses) == (1, 0)


def _recomputed(tmp_path, match):
    cache = ReferenceCache(tmp_path)
    with pytest.warns(ReferenceCacheWarning, match=match):
        result = cache.get(OP, CASE, INPUTS)
    assert (cache.hits, cache.misses) == (0, 1)
    _assert_fresh(result)
    _assert_hit(tmp_path)


def test_good_entry_is_a_hit_without_warning(tmp_path):
    _entry(tmp_path)
    _assert_hit(tmp_path)


def test_float32_entry_is_recomputed(tmp_path):
    path = _entry(tmp_path)
    cache = ReferenceCache(tmp_path)
    # a self-consistent entry (metadata and checksum agree) whose arrays are float32
    cache._store(cache.key(CASE, INPUTS), {n: a.astype(np.float32) for n, a in FRESH.items()})
    assert _read(path)["o"].dtype == np.float32
    _recomputed(tmp_path, r"float32, not float64")


def test_old_format_float32_entry_is_recomputed(tmp_path):
    path = _entry(tmp_path)
    np.savez(path, **{n: a.astype(np.float32) for n, a in FRESH.items()})  # no metadata, as format 1 wrote
    _recomputed(tmp_path, "no metadata")


def test_scaled_values_with_the_old_checksum_are_recomputed(tmp_path):
    path = _entry(tmp_path)
    arrays = _read(path)
    arrays["o"] = arrays["o"] * 1.5
    np.savez(path, **arrays)  # the metadata (and its checksum) are the original ones
    _recomputed(tmp_path, "checksum")


def test_truncated_entry_is_recomputed_and_replaced(tmp_path):
    path = _entry(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    _recomputed(tmp_path, "unreadable")
    assert path.read_bytes() == data  # replaced on disk by the same entry


@pytest.mark.parametrize("keep_metadata", [False, True], ids=["consistent-metadata", "stale-metadata"])
def test_entry_missing_a_tensor_is_recomputed(tmp_path, keep_metadata):
    path = _entry(tmp_path)
    cache = ReferenceCache(tmp_path)
    if keep_metadata:
        arrays = _read(path)
        del arrays["o"]
        np.savez(path, **arrays)
        match = "metadata lists"
    else:
        cache._store(cache.key(CASE, INPUTS), {n: a for n, a in FRESH.items() if n != "o"})
        match = r"lacks the compared tensor\(s\) \['o'\]"
    _recomputed(tmp_path, match)


def test_entry_for_another_key_or_format_is_recomputed(tmp_path, monkeypatch):
    path = _entry(tmp_path)
    cache = ReferenceCache(tmp_path)
    cache._store("0" * 64, dict(FRESH))
    path.write_bytes(cache._path("0" * 64).read_bytes())  # a valid entry, copied under this key's name
    _recomputed(tmp_path, "another key")
    monkeypatch.setattr(rc, "FORMAT", rc.FORMAT + 1)
    _recomputed(tmp_path, f"format {rc.FORMAT - 1}")


def test_bad_entry_does_not_stop_the_run(tmp_path):
    """The runner, not just the cache: a torn entry used to raise out of run_case or become an error row."""
    path = _entry(tmp_path)
    arrays = _read(path)
    del arrays["o"]
    np.savez(path, **arrays)
    with pytest.warns(ReferenceCacheWarning):
        rows = Runner(make_leg("ref", method="chunk"), ReferenceCache(tmp_path)).run_case(CASE)
    assert {r["status"] for r in rows} == {"ok"}


def test_reference_missing_a_compared_tensor_is_an_error(tmp_path):
    def reference(case, x, **kw):
        return {n: a for n, a in OP.reference(case, x, **kw).items() if n != "dq"}

    op = dataclasses.replace(OP, reference=reference)
    with pytest.raises(ValueError, match=r"returned no \['dq'\]"):
        ReferenceCache(tmp_path).get(op, CASE, INPUTS)
    assert not list(tmp_path.iterdir())  # nothing stored
    rows = Runner(make_leg("ref", method="chunk"), ReferenceCache(None), ops={CASE.op: op}).run_case(CASE)
    assert {r["status"] for r in rows} == {"error"} and "returned no ['dq']" in rows[0]["reason"]


def test_golden_cannot_be_edited_in_place(tmp_path):
    cache = ReferenceCache(tmp_path)
    golden = cache.get(OP, CASE, INPUTS)
    with pytest.raises(ValueError):
        golden["o"] *= 2
    _assert_fresh(cache.get(OP, CASE, INPUTS))


@pytest.mark.parametrize("setup", ["read-only", "under-a-file"])
def test_unwritable_cache_dir_does_not_fail(tmp_path, monkeypatch, setup):
    if setup == "read-only":
        path = _entry(tmp_path)
        path.write_bytes(b"torn")
        directory = tmp_path

        def refuse(*args, **kwargs):  # what a read-only mount answers, even to root
            raise PermissionError(30, "Read-only file system")

        monkeypatch.setattr(rc.tempfile, "mkstemp", refuse)
        with pytest.warns(ReferenceCacheWarning, match="unreadable"):
            _assert_fresh(ReferenceCache(directory).get(OP, CASE, INPUTS))
        assert path.read_bytes() == b"torn"
    else:
        (tmp_path / "file").write_text("")
        directory = tmp_path / "file" / "cache"
        with warnings.catch_warnings():
            warnings.simplefilter("error", ReferenceCacheWarning)  # no entry is no news
            _assert_fresh(ReferenceCache(directory).get(OP, CASE, INPUTS))
    assert not list(tmp_path.glob("*.tmp.npz"))
