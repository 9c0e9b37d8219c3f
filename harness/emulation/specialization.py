"""A Triton launch as the CUDA launcher would compile it: the specialization of a kernel call, and its compile.

Both the PTX check (``ptx``) and the reduction order (``reduce_order``) need the same two things from a launch that
the Triton interpreter ran: which specialization Triton's own launcher would have compiled (argument types,
constexprs including the pinned autotune config and heuristics, divisibility attributes, ``num_warps`` /
``num_stages``), and that kernel compiled for an NVIDIA target in a process that is not in interpreter mode. This
module is that one description; neither caller builds a specialization or a compile of its own.
"""

from __future__ import annotations

import hashlib
import json
from typing import Dict, Optional


def _encode_value(v):
    import triton.language as tl

    if isinstance(v, tl.dtype):
        return {"t": "dtype", "v": str(v)}
    if v is None or isinstance(v, (bool, int, float, str)):
        return {"t": type(v).__name__, "v": v}
    return {"t": type(v).__name__, "v": repr(v)}


def _decode_value(d):
    import triton.language as tl

    if d["t"] == "dtype":
        return tl.dtype(d["v"])
    return d["v"]


def specialization_key(rec: dict) -> str:
    body = json.dumps({k: rec[k] for k in ("module", "qualname", "signature", "constexprs", "attrs", "options")},
                      sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:10]


class Specializer:
    """Turns an interpreted launch (the ``InterpretedFunction``, its arguments and keyword arguments as
    ``InterpretedFunction.run`` receives them) into the specialization record Triton's CUDA launcher would compile:
    ``module``, ``qualname``, ``signature``, ``constexprs``, ``attrs``, ``options`` and ``key``
    (:func:`specialization_key`). ``source_key`` is Triton's own hash of the kernel's source and of every JIT
    function it calls (``JITFunction.cache_key``), so an edit of fla's kernels changes it."""

    def __init__(self):
        from triton.backends.compiler import GPUTarget
        from triton.compiler import make_backend

        self._backend = make_backend(GPUTarget("cuda", 90, 32))
        self._jit: Dict[int, object] = {}

    def record(self, interp_fn, args, kwargs) -> dict:
        from triton import knobs
        from triton.runtime.jit import JITFunction, create_function_from_signature

        jf = self._jit.get(id(interp_fn))
        if jf is None:
            jf = JITFunction(interp_fn.fn, **interp_fn.kwargs)
            jf._ptx_binder = create_function_from_signature(jf.signature, jf.params, self._backend)
            self._jit[id(interp_fn)] = jf
        kw = dict(kwargs)  # as JITFunction.run completes them
        kw["debug"] = kw.get("debug", jf.debug) or knobs.runtime.debug
        kw["instrumentation_mode"] = knobs.compilation.instrumentation_mode
        kw["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
        bound, spec, opts = jf._ptx_binder(*args, **kw)
        _options, signature, constexprs, attrs = jf._pack_args(self._backend, kw, bound, spec, opts)
        names = {p.name for p in jf.params}
        rec = {
            "module": interp_fn.fn.__module__,
            "qualname": interp_fn.fn.__qualname__,
            "signature": signature,
            "constexprs": sorted([list(k), _encode_value(v)] for k, v in constexprs.items()),
            "attrs": sorted([list(k), [list(a) for a in v]] for k, v in attrs.items()),
            "options": {k: v for k, v in kwargs.items() if k not in names},
        }
        rec["key"] = specialization_key(rec)
        rec["file"] = interp_fn.fn.__code__.co_filename  # where to load it from when not importable by name
        return rec


def resolve_kernel(module: str, qualname: str, file: Optional[str] = None):
    """The compiled (``JITFunction``) kernel of a record, in a process that is not in interpreter mode. A module that
    is not importable by name (a kernel written in a test or a script) is loaded from ``file``."""
    import importlib
    import importlib.util
    import sys

    from triton.runtime.jit import JITFunction

    try:
        obj = importlib.import_module(module)
    except ModuleNotFoundError:
        if file is None:
            raise
        spec = importlib.util.spec_from_file_location(module, file)
        obj = importlib.util.module_from_spec(spec)
        sys.modules[module] = obj
        spec.loader.exec_module(obj)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    seen = 0
    while not isinstance(obj, JITFunction) and seen < 8:
        obj = getattr(obj, "fn")
        seen += 1
    if not isinstance(obj, JITFunction):
        raise RuntimeError(f"{module}.{qualname} is not a Triton JITFunction in this process")
    return obj


def compile_record(rec: dict, cc: int):
    """``triton.compile`` of a specialization record for ``sm_<cc>`` (no GPU needed: Triton's NVIDIA backend runs on
    the CPU). Returns the ``CompiledKernel`` (its ``asm`` holds ttir, ttgir, llir, ptx)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = resolve_kernel(rec["module"], rec["qualname"], rec.get("file"))
    constexprs = {tuple(k): _decode_value(v) for k, v in rec["constexprs"]}
    attrs = {tuple(k): [tuple(a) for a in v] for k, v in rec["attrs"]}
    src = ASTSource(fn, rec["signature"], constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", cc, 32), options=dict(rec["options"]))
