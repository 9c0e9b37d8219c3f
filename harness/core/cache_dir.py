"""Where this harness keeps its caches: one rule for every cache (the references, the legs' rows, the emulation's
compiled layouts), applied by the front to the environment it is given.

``$PARITY_CACHE_DIR`` when set, ``~/.cache/linear-attn-parity`` when not, and no cache at all when it is set empty.
The front (the CLI, the pytest plugin, a script's ``main``) hands this its ``os.environ`` once and puts the answer
in the run's records (harness.app.settings.RunSettings.cache_dir); every stage is given its directory."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

ENVIRONMENT = "PARITY_CACHE_DIR"


def default_cache_dir(environ: Mapping[str, str]) -> Path | None:
    """The caches' root under ``environ`` (the front's ``os.environ``); None for no cache."""
    value = environ.get(ENVIRONMENT)
    if value == "":
        return None  # explicitly disabled
    return Path(value) if value else Path.home() / ".cache" / "linear-attn-parity"
