"""Where the GPU leg runs: native CUDA or the Triton interpreter, and the versions it ran with."""

from __future__ import annotations

import importlib.metadata
import os
import sys
from typing import Any, Dict, Optional


def _dist_version(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def triton_versions() -> Dict[str, Optional[str]]:
    """Versions of the packages that define the GPU leg's numerics."""
    import torch
    import triton

    return {
        "triton": triton.__version__,
        "fla-core": _dist_version("fla-core"),
        "torch": torch.__version__,
    }


EMULATED_TRITON = "3.9"
"""The Triton release whose interpreter the fidelity fixes patch (its builder, handles and dot semantics):
``triton==3.9.*``, as the ``cpu`` extra pins it. Others differ inside (triton 3.7.1's InterpreterBuilder
has no ``get_bf16``), so the emulated leg refuses them rather than measure something else."""


def emulation_problem(version: Optional[str] = None) -> Optional[str]:
    """Why this process's triton cannot be emulated, or None. ``version`` defaults to the installed one, read
    from its metadata: importing triton here, before the leg sets interpreter mode, would decide it too early."""
    if version is None:
        version = _dist_version("triton") or "none"
    if version.split(".")[:2] == EMULATED_TRITON.split("."):
        return None
    return (f"the emulated GPU leg needs triton {EMULATED_TRITON}.x (its interpreter fixes patch that release); "
            f"found {version}: pip install 'triton=={EMULATED_TRITON}.*', as the cpu extra pins it")


def native_cuda_available() -> bool:
    """True when kernels can run natively (``torch.cuda.is_available()``)."""
    import torch

    return bool(torch.cuda.is_available())


def interpreter_mode_enabled() -> bool:
    """Whether ``triton.jit`` currently creates interpreted kernels."""
    import triton

    return bool(triton.knobs.runtime.interpret)


def _is_interpreted_kernel(obj: Any) -> Optional[bool]:
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    seen = 0
    while obj is not None and seen < 16:
        if isinstance(obj, InterpretedFunction):
            return True
        if isinstance(obj, JITFunction):
            return False
        obj = getattr(obj, "fn", None)
        seen += 1
    return None


def enable_interpreter_mode() -> None:
    """Put this process in Triton interpreter mode.

    Must run before the first import of fla (or any module that defines
    ``@triton.jit`` kernels): Triton 3.9 decides interpreted vs compiled when a
    kernel is decorated.  Raises if fla was already imported with compiled
    kernels, because those can no longer be switched.
    """
    os.environ["TRITON_INTERPRET"] = "1"
    import triton

    triton.knobs.runtime.interpret = True
    if "fla.ops.utils.op" in sys.modules:
        state = _is_interpreted_kernel(getattr(sys.modules["fla.ops.utils.op"], "exp", None))
        if state is False:
            raise RuntimeError("fla was imported before TRITON_INTERPRET=1 was set; its kernels are compiled "
                               "JITFunctions. Enable interpreter mode before importing fla (new process).")
