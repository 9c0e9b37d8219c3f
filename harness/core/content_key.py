"""One rule for content keys: the sha256 every cache and record of this harness keys its entries by (the
reference cache's sources, the legs' output caches, the compile and PTX records).

A file is named in a key by its path relative to this repository (:func:`file_name`), so that a clone elsewhere,
or a checkout at another path, computes the same key and a committed record is verified in any of them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""This repository: the root file names in a key are relative to."""


def digest(data: bytes) -> str:
    """sha256 of ``data``, in hex."""
    return hashlib.sha256(data).hexdigest()


def record_digest(record) -> str:
    """sha256 of a JSON-able record, its keys sorted (the same record, the same key, whatever its order)."""
    return digest(json.dumps(record, sort_keys=True).encode())


def file_name(path) -> str:
    """A file's name in a key: relative to this repository (the same in every clone and checkout), or its full
    path for a file outside it."""
    resolved = Path(path).resolve()
    return resolved.relative_to(ROOT).as_posix() if resolved.is_relative_to(ROOT) else str(resolved)


def files_digest(paths) -> str:
    """sha256 of the files' names (:func:`file_name`) and contents, in the order of their names: one key for a
    set of sources."""
    h = hashlib.sha256()
    for name, path in sorted({file_name(p): p for p in paths}.items()):
        h.update(name.encode())
        h.update(Path(path).read_bytes())
    return h.hexdigest()


def file_digests(paths) -> dict[str, str]:
    """{name: sha256 of its contents} for each file (:func:`file_name`), sorted by name: a key that can say which
    file moved."""
    return {name: digest(Path(path).read_bytes()) for name, path in sorted({file_name(p): p for p in paths}.items())}
