"""The float64 golden results, cached by input hash.

References are deterministic but not cheap, and every leg of a run needs the
same one. Results are kept in memory for the run and, unless disabled, on disk
as ``.npz`` under ``$PARITY_CACHE_DIR`` (default ``~/.cache/linear-attn-parity``).
The key covers the case id, the sha256 of the input bytes and the sha256 of
the reference sources, so editing a reference never serves a stale result.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np

from cases.case import Case
from cases.inputs import Inputs

from .ops.base import OpDescriptor

_REFERENCES_DIR = Path(__file__).resolve().parent.parent / "references"


def _references_fingerprint() -> str:
    h = hashlib.sha256()
    for path in sorted(_REFERENCES_DIR.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def default_cache_dir() -> Path | None:
    value = os.environ.get("PARITY_CACHE_DIR")
    if value == "":
        return None  # explicitly disabled
    return Path(value) if value else Path.home() / ".cache" / "linear-attn-parity"


class ReferenceCache:
    def __init__(self, directory: Path | None | str = "default"):
        self.directory = default_cache_dir() if directory == "default" else (Path(directory) if directory else None)
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
        result = self._load(key)
        if result is None:
            self.misses += 1
            raw = op.reference(case, inputs.as_float64())
            result = {name: np.asarray(a) for name, a in raw.items() if a is not None}
            for name, a in result.items():
                if a.dtype != np.float64:
                    raise TypeError(f"reference of {op.name} returned {name} as {a.dtype}, not float64")
            self._store(key, result)
        else:
            self.hits += 1
        self._memory[key] = result
        return result

    def _path(self, key: str) -> Path | None:
        return None if self.directory is None else self.directory / f"{key}.npz"

    def _load(self, key: str):
        path = self._path(key)
        if path is None or not path.exists():
            return None
        try:
            with np.load(path) as data:
                return {name: data[name] for name in data.files}
        except (OSError, ValueError):
            return None  # a torn or foreign file: recompute

    def _store(self, key: str, result: dict[str, np.ndarray]) -> None:
        path = self._path(key)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp.npz")
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **result)
            os.replace(tmp, path)
        except OSError:
            pass  # the cache is an optimisation; a read-only home must not fail a run
