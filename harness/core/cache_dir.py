"""Where this harness keeps its caches: one rule for every cache (the references, the legs' rows, the emulation's
compiled layouts).

``$PARITY_CACHE_DIR`` when set, ``~/.cache/linear-attn-parity`` when not, and no cache at all when it is set empty."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path | None:
    value = os.environ.get("PARITY_CACHE_DIR")
    if value == "":
        return None  # explicitly disabled
    return Path(value) if value else Path.home() / ".cache" / "linear-attn-parity"
