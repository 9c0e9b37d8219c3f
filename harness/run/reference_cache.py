"""The float64 golden results, cached by input hash, and verified on every load.

References are deterministic but not cheap, and every leg of a run needs the
same one. Results are kept in memory for the run and, unless disabled, on disk
as ``.npz`` under ``$PARITY_CACHE_DIR`` (default ``~/.cache/linear-attn-parity``).
The key covers the case id, the sha256 of the input bytes and the sha256 of
the sources a golden depends on (references, op descriptors, case model), so
editing one never serves a stale result.

An entry holds the reference's arrays plus ``__meta__`` (JSON bytes): the
format version, the key, each tensor's dtype and shape, and a sha256 over
every array's name, dtype, shape and bytes. A file is used only when all of
it checks out, every tensor is float64 and every compared tensor of the case
is present, with the magnitudes of every tensor the descriptor declares a sum
(:mod:`harness.ops.reductions`: ``<tensor>|terms|``, the float64 ``sum |c|`` its
bound is judged against); anything else (unreadable, truncated, tampered, older format) is
recomputed and atomically replaced with a :class:`ReferenceCacheWarning`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np

from cases.case import Case
from cases.inputs import Inputs

from harness.ops.base import OpDescriptor, call_k_first, state_k_first
from harness.ops.reductions import magnitude_name, magnitudes, reduction_of
from harness.core.content_key import files_digest

_ROOT = Path(__file__).resolve().parents[2]  # the repository: harness/<stage>/<module>.py
# what a golden result depends on besides its inputs: the references, and the descriptors that call them
_SOURCES = ("references/*.py", "harness/ops/*.py", "cases/*.py")
FORMAT = 2  # 1 was the bare npz without metadata
META_ENTRY = "__meta__"


class ReferenceCacheWarning(UserWarning):
    """A cache file was not used: it is recomputed and replaced."""


def _references_fingerprint() -> str:
    """The key of the goldens' sources (:data:`_SOURCES`: :func:`harness.core.content_key.files_digest`)."""
    return files_digest(p for pattern in _SOURCES for p in _ROOT.glob(pattern))


def arrays_checksum(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = arrays[name]
        # name, dtype and shape are hashed too: the same bytes read as float32, or reshaped, must not match
        h.update(json.dumps([name, a.dtype.str, list(a.shape)]).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _describe(a: np.ndarray) -> dict:
    return {"dtype": str(a.dtype), "shape": list(a.shape)}


def _metadata(key: str, arrays: dict[str, np.ndarray]) -> np.ndarray:
    meta = {"format": FORMAT, "key": key, "tensors": {n: _describe(a) for n, a in arrays.items()},
            "sha256": arrays_checksum(arrays)}
    return np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8)  # no pickle needed to read


def entry_metadata(arrays: dict[str, np.ndarray], key: str, fmt: int) -> dict | str:
    """The metadata of a loaded cache entry (popped from ``arrays``: its ``__meta__`` record), or what is wrong
    with it: none, unreadable, another format or key, tensors other than it lists. Shared by every on-disk
    cache here (this one, :mod:`harness.run.baseline_cache`)."""
    raw = arrays.pop(META_ENTRY, None)
    if raw is None:
        return "it has no metadata (an older cache format)"
    try:
        meta = json.loads(raw.tobytes().decode())
        version, stored_key, tensors, _ = meta["format"], meta["key"], meta["tensors"], meta["sha256"]
    except (ValueError, KeyError, TypeError) as exc:
        return f"its metadata is unreadable ({type(exc).__name__})"
    if version != fmt:
        return f"it has cache format {version!r}, not {fmt}"
    if stored_key != key:
        return "its metadata names another key"
    if not isinstance(tensors, dict) or set(arrays) != set(tensors):
        return f"it holds tensors {sorted(arrays)}, its metadata lists {sorted(tensors)}"
    return meta


def _problem(arrays: dict[str, np.ndarray], key: str, expected: list[str]) -> str | None:
    """What is wrong with a loaded entry (``arrays`` with its ``__meta__``), or None when it can be used."""
    meta = entry_metadata(arrays, key, FORMAT)
    if isinstance(meta, str):
        return meta
    tensors, checksum = meta["tensors"], meta["sha256"]
    missing = [n for n in expected if n not in arrays]
    if missing:
        return f"it lacks the compared tensor(s) {missing}"
    for name, a in arrays.items():
        if a.dtype != np.float64:
            return f"its {name} is {a.dtype}, not float64"
        if _describe(a) != tensors[name]:
            return f"its {name} is {_describe(a)}, its metadata says {tensors[name]}"
    if arrays_checksum(arrays) != checksum:
        return "its checksum does not match its values"
    return None


def expected_names(op: OpDescriptor, case: Case) -> list[str]:
    """What a golden of ``case`` holds: every compared tensor, and the magnitudes of those declared sums."""
    specs = op.tensors(case)
    return [s.name for s in specs] + [magnitude_name(s.name) for s in specs if reduction_of(s) is not None]


class ReferenceCache:
    def __init__(self, directory: Path | None = None):
        """Goldens kept in memory, and under ``directory`` on disk when given (the front's cache root)."""
        self.directory = Path(directory) if directory else None
        self._memory: dict[str, dict[str, np.ndarray]] = {}
        self._fingerprint = _references_fingerprint()
        self.hits = 0
        self.misses = 0

    def key(self, case: Case, inputs: Inputs) -> str:
        return hashlib.sha256(f"{case.id}|{inputs.sha256}|{self._fingerprint}".encode()).hexdigest()

    def get(self, op: OpDescriptor, case: Case, inputs: Inputs) -> dict[str, np.ndarray]:
        key = self.key(case, inputs)
        if key in self._memory:
            self.hits += 1
            return self._memory[key]
        expected = expected_names(op, case)
        result = self._load(key, expected)
        if result is None:
            self.misses += 1
            result = self._compute(op, case, inputs)
            self._store(key, result)
        else:
            self.hits += 1
        for a in result.values():
            a.flags.writeable = False  # every leg shares this golden: an in-place edit must not move it
        self._memory[key] = result
        return result

    @staticmethod
    def _compute(op: OpDescriptor, case: Case, inputs: Inputs) -> dict[str, np.ndarray]:
        raw = call_k_first(case, op.reference, inputs.as_float64())
        result = {name: np.asarray(a) for name, a in raw.items() if a is not None}
        missing = [n for n in op.tensor_names(case) if n not in result]
        if missing:
            # otherwise the comparison would fail later with a bare KeyError, or not at all for a leg without it
            raise ValueError(f"reference of {op.name} returned no {missing} for {case.id}; "
                             f"it must return every tensor of op.tensors(case)")
        for name, a in result.items():
            if a.dtype != np.float64:
                raise TypeError(f"reference of {op.name} returned {name} as {a.dtype}, not float64")
        x = None
        for spec in op.tensors(case):
            reduction = reduction_of(spec)
            if reduction is None:
                continue
            x = state_k_first(case, inputs.as_float64()) if x is None else x
            terms = reduction.contributions(op, case, x, result)
            result[magnitude_name(spec.name)] = magnitudes(terms, result[spec.name], spec.name)
        return result

    def _path(self, key: str) -> Path | None:
        return None if self.directory is None else self.directory / f"{key}.npz"

    def _load(self, key: str, expected: list[str]) -> dict[str, np.ndarray] | None:
        path = self._path(key)
        if path is None:
            return None
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {name: data[name] for name in data.files}
            problem = _problem(arrays, key, expected)
        except (FileNotFoundError, NotADirectoryError):
            return None  # no entry yet
        except Exception as exc:  # noqa: BLE001 - BadZipFile, zlib.error, EOFError...: any torn file is recomputed
            problem = f"it is unreadable ({type(exc).__name__}: {' '.join(str(exc).split())})"
        if problem is None:
            return arrays
        warnings.warn(f"reference cache: not using {path}: {problem}; recomputing and replacing it",
                      ReferenceCacheWarning, stacklevel=3)
        return None

    def _store(self, key: str, result: dict[str, np.ndarray]) -> None:
        path = self._path(key)
        if path is None:
            return
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp.npz")
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **result, **{META_ENTRY: _metadata(key, result)})
            os.replace(tmp, path)  # readers see the old file or the whole new one, never a torn one
        except OSError:
            # the cache is an optimisation; a read-only home must not fail a run
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
