"""fla's gather-free path inside an emulation block (the interpreter has no ``tl.gather``)."""

from __future__ import annotations

import sys
from typing import List

from .patcher import Patcher


def install_fla_gather_fallback(patcher: Patcher) -> List[str]:
    """The interpreter has no ``tl.gather``; fla picks it at call time from a module
    global (``USE_GATHER=IS_GATHER_SUPPORTED``, e.g. kda's safe-gate intra kernel).
    Point the already-imported fla modules at their gather-free path for the block.
    Selecting one element by gather or by its masked sum is exact either way."""
    patched = []
    for name, module in list(sys.modules.items()):
        if name.startswith("fla.") and getattr(module, "IS_GATHER_SUPPORTED", False) is True:
            patcher.set_attr(module, "IS_GATHER_SUPPORTED", False)
            patched.append(name)
    return sorted(patched)
