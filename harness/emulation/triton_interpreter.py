"""H100-like numerics for Triton kernels run on CPU through the Triton interpreter.

The harness runs flash-linear-attention (fla) Triton kernels as its "GPU leg":
natively on CUDA when a GPU is present, otherwise on CPU with
``TRITON_INTERPRET=1``.  Out of the box the interpreter (triton 3.9,
``triton/runtime/interpreter.py``) is not usable for a numerical parity study:

1. ``@triton.autotune`` kernels fail with ``RuntimeError: 0 active drivers``:
   the Autotuner times every config and the timer needs a driver.
2. ``for i in range(n)`` binds a Python ``int`` (the interpreter maps ``range``
   to Python's range), so ``i.to(tl.int64)`` raises; compiled Triton binds an
   int32/int64 scalar tensor.
3. bfloat16 is stored as ``uint16`` bits and numpy arithmetic, comparisons,
   reductions and ``np.matmul`` are applied to those raw bits (bf16 ``a*b + a``
   with a=-3, b=4 gives -5.5e19).  Casts f32->bf16 truncate instead of rounding
   to nearest even, and the interpreter's own RTNE path rounds ties up.
4. ``tl.dot`` ignores ``input_precision``: float32 dots are computed with full
   float32 inputs, while an H100 feeds TF32 to the tensor cores by default.

:func:`triton_emulation` is a context manager that fixes all of this for the
duration of a ``with`` block and restores every patched attribute on exit
(including on exceptions).  Nothing in site-packages is edited.  It refuses to
run when Triton is not in interpreter mode, so it can never alter a native run.
:func:`pinned_autotune` is the autotune part alone, for native runs, so that
emulated and native runs use the same config (same tiling, same reduction
order).

TRITON_INTERPRET
----------------
Triton 3.9 reads ``knobs.runtime.interpret`` (env ``TRITON_INTERPRET``) inside
``triton.jit`` when a kernel is *decorated*, i.e. when fla's modules are
imported: it decides once whether the kernel object is an
``InterpretedFunction`` or a compiled ``JITFunction``.  It cannot be toggled for
kernels that already exist, so the context manager does not try.  The leg must
call :func:`enable_interpreter_mode` (or export ``TRITON_INTERPRET=1``) before
the first ``import fla``, in a process that will only emulate; a process that
runs natively simply never sets it.

Numerical model (what "H100-like" means here)
----------------------------------------------
* bf16 elementwise ops: operands decoded to float32, op evaluated in float32,
  result rounded to bf16 with round-to-nearest-even (RNE).  For + - * / and
  sqrt the double rounding f32->bf16 is innocuous (24 >= 2*8+2 bits), so this
  equals a correctly rounded bf16 op, which is what sm_90 bf16 arithmetic and
  ``cvt.rn.bf16.f32`` give.  Transcendentals (exp, log, ...) use numpy's
  float32 versions, not the GPU's approximate ``ex2.approx`` etc.
* bf16 reductions: pairwise tree with an RNE rounding after every add; bf16
  cumsum/cumprod: sequential with a rounding after every step.  The GPU's exact
  combine order depends on the layout and is not reproduced.
* casts to bf16 (from f32, f64, f16, ints) round to nearest even unless the
  kernel asks for ``fp_downcast_rounding="rtz"``.
* ``tl.dot`` with bf16/fp16/fp8 inputs: products are exact, the K-sum (plus the
  accumulator) is formed in float64 and rounded once to the output type
  (float32).  This is ideal float32 accumulation; the tensor core's internal
  per-k-chunk alignment/rounding is slightly worse and is not modelled.
* ``tl.dot`` with float32 inputs follows the dot's resolved ``input_precision``:

  - ``"tf32"``: inputs reduced to TF32 (10 explicit mantissa bits) then as
    above.  How they are reduced is ``tf32_rounding``: default ``"truncate"``.
    Triton's tf32 lowering passes raw fp32 registers to ``mma``/``wgmma`` and
    the tensor core ignores the 13 low mantissa bits (truncation toward zero);
    see triton-lang/triton#4574, where inserting ``cvt.rna.tf32.f32`` was what
    made Triton match cuBLAS.  ``"rna"`` (ties away, = ``cvt.rna``) and
    ``"rne"`` (= what the interpreter uses for TMA descriptors and what cuBLAS
    /CUTLASS converters do) are available for sensitivity studies.
  - ``"tf32x3"``: Triton's F32DotTC decomposition: big = cvt.rna(x),
    small = x - big; acc1 = small_a@big_b, acc2 = big_a@small_b + acc1,
    result = big_a@big_b + acc2 + acc, each partial dot on TF32 inputs with one
    float32 rounding.
  - ``"ieee"``: sequential float32 FMA chain over K starting from the
    accumulator (the FMA lowering used for non-tensor-core dots).

  The default input precision is resolved exactly like on a GPU: an explicit
  ``input_precision``/``allow_tf32`` in the kernel wins, otherwise
  ``TRITON_F32_DEFAULT`` (``triton.knobs.language.fp32_default``), otherwise
  "tf32".  ``dot_precision=...`` sets that default for the block (the same
  effect as exporting TRITON_F32_DEFAULT for a native run);
  ``force_dot_precision=True`` overrides even explicit kernel settings.
* autotuning: the first config that survives the kernel's own
  ``early_config_prune``/``perf_model`` pruning, in declaration order (rule
  ``"first"``); ``"last"`` or a callable are also accepted.  No timing, no
  driver, nothing written to the autotuner's cache.  Caveat: fla builds some
  config lists from device queries at import time, so the *list* can differ
  between a CPU process and a GPU process; compare the recorded configs.

Not covered: fp8 arithmetic beyond dot inputs, bf16 atomics, libdevice /
inline asm (unsupported by the interpreter anyway).  Single-threaded use only:
the interpreter itself keeps global state.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib.metadata
import os
import sys
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np

__all__ = [
    "AutotuneRecord",
    "EmulationSession",
    "bf16_bits_to_f32",
    "enable_interpreter_mode",
    "f32_to_bf16_bits",
    "interpreter_mode_enabled",
    "native_cuda_available",
    "pinned_autotune",
    "round_to_tf32",
    "triton_emulation",
    "triton_versions",
]

_MISSING = object()
_LOCK = threading.RLock()
DOT_PRECISIONS = ("tf32", "tf32x3", "ieee")
TF32_ROUNDINGS = ("truncate", "rne", "rna")

# --------------------------------------------------------------------------
# Environment information
# --------------------------------------------------------------------------


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


# --------------------------------------------------------------------------
# Bit-level helpers (exported; the tests use them as references)
# --------------------------------------------------------------------------


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """Decode bfloat16 bit patterns (uint16) to float32 values (exact)."""
    return (np.asarray(bits).astype(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16_bits(x: np.ndarray, rounding: str = "rne") -> np.ndarray:
    """Encode float32 values as bfloat16 bits; ``rounding`` is "rne" or "rtz".

    NaNs stay NaN (quiet bit forced), infinities stay infinite, overflow in RNE
    rounds to infinity as on the GPU.
    """
    bits = np.array(x, dtype=np.float32, copy=True).view(np.uint32)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if rounding == "rne":
        lsb = (bits >> np.uint32(16)) & np.uint32(1)
        out = (bits + np.uint32(0x7FFF) + lsb) >> np.uint32(16)
    elif rounding == "rtz":
        out = bits >> np.uint32(16)
    else:
        raise ValueError(f"unknown bf16 rounding {rounding!r}")
    out = np.where(nan, (bits >> np.uint32(16)) | np.uint32(0x0040), out)
    return out.astype(np.uint16)


def _f64_to_bf16_bits(x: np.ndarray, rounding: str = "rne") -> np.ndarray:
    """Round float64 values straight to bf16 (no double rounding via f32).

    The rounding is done on the float64 bit pattern (keep 7 of 52 fraction
    bits); the result then converts to float32 exactly.  In the float32
    subnormal range (|x| < 2**-126) we go through float32 instead, accepting a
    possible double rounding there.
    """
    x = np.asarray(x, dtype=np.float64)
    bits = x.copy().view(np.uint64)  # copy(): C-contiguous, keeps 0-d shape
    if rounding == "rne":
        lsb = (bits >> np.uint64(45)) & np.uint64(1)
        rb = (bits + np.uint64((1 << 44) - 1) + lsb) & ~np.uint64((1 << 45) - 1)
    else:
        rb = bits & ~np.uint64((1 << 45) - 1)
    finite = np.isfinite(x)
    rounded = np.where(finite, rb, bits).view(np.float64)
    with np.errstate(over="ignore"):
        as32 = rounded.astype(np.float32)
    tiny = np.abs(x) < 2.0**-126
    direct = f32_to_bf16_bits(as32, "rtz")  # exact: as32 has <= 8 significant bits
    via32 = f32_to_bf16_bits(x.astype(np.float32), rounding)
    return np.where(tiny | ~finite, via32, direct).astype(np.uint16)


def _round_bf16_f32(x: np.ndarray) -> np.ndarray:
    """float32 -> nearest bf16 value, returned as float32."""
    return bf16_bits_to_f32(f32_to_bf16_bits(x))


def round_to_tf32(x: np.ndarray, mode: str = "truncate") -> np.ndarray:
    """Reduce float32 values to TF32 (1+8+10 bits), returned as float32.

    mode: "truncate" (what the tensor core does with raw fp32 registers),
    "rne" (nearest, ties to even) or "rna" (nearest, ties away from zero, =
    ``cvt.rna.tf32.f32``).  Inf/NaN pass through unchanged.
    """
    bits = np.array(x, dtype=np.float32, copy=True).view(np.uint32)
    special = (bits & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    mask = np.uint32(0xFFFFE000)
    if mode == "truncate":
        out = bits & mask
    elif mode == "rne":
        out = (bits + np.uint32(0xFFF) + ((bits >> np.uint32(13)) & np.uint32(1))) & mask
    elif mode == "rna":
        out = (bits + np.uint32(0x1000)) & mask
    else:
        raise ValueError(f"unknown tf32 rounding {mode!r}")
    return np.where(special, bits, out).view(np.float32)


# --------------------------------------------------------------------------
# Reversible patching
# --------------------------------------------------------------------------


class _Patcher:
    """Records every change so ``restore`` can undo them in reverse order."""

    def __init__(self) -> None:
        self._undo: List[Callable[[], None]] = []

    def set_attr(self, obj: Any, name: str, value: Any) -> None:
        # Only look at obj.__dict__ so that restoring never turns an inherited
        # class attribute into an own attribute.
        own = vars(obj).get(name, _MISSING) if hasattr(obj, "__dict__") else getattr(obj, name, _MISSING)
        setattr(obj, name, value)

        def undo(obj=obj, name=name, own=own):
            if own is _MISSING:
                try:
                    delattr(obj, name)
                except AttributeError:
                    pass
            else:
                setattr(obj, name, own)

        self._undo.append(undo)

    def set_env(self, key: str, value: Optional[str]) -> None:
        old = os.environ.get(key)
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value

        def undo(key=key, old=old):
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old

        self._undo.append(undo)

    def add_undo(self, fn: Callable[[], None]) -> None:
        self._undo.append(fn)

    def restore(self) -> None:
        errors = []
        while self._undo:
            try:
                self._undo.pop()()
            except Exception as e:  # keep restoring the rest
                errors.append(e)
        if errors:
            raise errors[0]


# --------------------------------------------------------------------------
# 1. Deterministic autotune
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AutotuneRecord:
    """One deterministic autotune decision (one kernel, one tuning key)."""

    kernel: str
    key: Tuple[str, ...]
    config: Dict[str, Any]  # the config's kwargs (BT, BK, ...)
    num_warps: Optional[int]
    num_stages: Optional[int]
    num_ctas: Optional[int]
    index: int  # position in the kernel's declared config list
    n_configs: int  # declared configs
    n_candidates: int  # configs left after the kernel's own pruning
    rule: str

    def as_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def short(self) -> str:
        kw = ",".join(f"{k}={v}" for k, v in sorted(self.config.items()))
        return f"{self.kernel}[{kw},w{self.num_warps},s{self.num_stages}]"


AutotuneRule = Union[str, Callable[[list, dict, dict], Any]]


class _AutotuneRecorder:

    def __init__(self) -> None:
        self._records: Dict[Tuple[str, Tuple[str, ...]], AutotuneRecord] = {}

    def add(self, rec: AutotuneRecord) -> None:
        self._records.setdefault((rec.kernel, rec.key), rec)

    def records(self) -> List[AutotuneRecord]:
        return list(self._records.values())


_RECORDERS: List[_AutotuneRecorder] = []


def _tuning_key(tuner, args, kwargs) -> Tuple[str, ...]:
    all_args = {**dict(zip(tuner.arg_names, args)), **kwargs}
    named = {k: v for k, v in all_args.items() if k in tuner.arg_names}
    key = [repr(named[k]) for k in tuner.keys if k in named]
    key += [str(v.dtype) for v in named.values() if hasattr(v, "dtype")]
    return tuple(key)


def _choose(rule: AutotuneRule, candidates: list, nargs: dict, kwargs: dict):
    if callable(rule):
        return rule(candidates, nargs, kwargs)
    if rule == "first":
        return candidates[0]
    if rule == "last":
        return candidates[-1]
    raise ValueError(f"unknown autotune rule {rule!r}")


def _make_pinned_run(rule: AutotuneRule):
    rule_name = rule if isinstance(rule, str) else getattr(rule, "__name__", "callable")

    def run(self, *args, **kwargs):
        # Replaces Autotuner.run: choose by rule instead of timing every config
        # (timing needs a driver, and a timing-based choice is not reproducible
        # across machines).  self.cache is neither read nor written, so FLA's
        # JSON config cache and earlier native tuning cannot leak in and the
        # autotuner is untouched after the block.
        self.nargs = dict(zip(self.arg_names, args))
        try:
            candidates = self.prune_configs(kwargs) if len(self.configs) > 1 else list(self.configs)
            config = _choose(rule, list(candidates), self.nargs, kwargs)
            self.best_config = config
            if _RECORDERS:
                try:
                    index = self.configs.index(config)
                except ValueError:
                    index = -1
                name = getattr(getattr(self, "base_fn", None), "__name__", None) or repr(self.fn)
                rec = AutotuneRecord(kernel=name, key=_tuning_key(self, args, kwargs), config=dict(config.kwargs),
                                     num_warps=getattr(config, "num_warps", None),
                                     num_stages=getattr(config, "num_stages", None),
                                     num_ctas=getattr(config, "num_ctas", None), index=index,
                                     n_configs=len(self.configs), n_candidates=len(candidates), rule=rule_name)
                for r in _RECORDERS:
                    r.add(rec)
            if config.pre_hook is not None:
                config.pre_hook({**self.nargs, **kwargs, **config.all_kwargs()})
            return self.fn.run(*args, **kwargs, **config.all_kwargs())
        finally:
            self.nargs = None

    return run


def _autotuner_classes() -> List[type]:
    from triton.runtime.autotuner import Autotuner

    out, todo = [], [Autotuner]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return out


def _install_autotune_pin(patcher: _Patcher, rule: AutotuneRule, recorder: _AutotuneRecorder) -> None:
    if isinstance(rule, str) and rule not in ("first", "last"):
        raise ValueError(f"unknown autotune rule {rule!r}")
    run = _make_pinned_run(rule)
    # Patch every loaded Autotuner class that defines its own run (fla's
    # CachedAutotuner does: it would first look up fla/configs/<GPU>/*.json).
    for cls in _autotuner_classes():
        if "run" in vars(cls):
            patcher.set_attr(cls, "run", run)
    _RECORDERS.append(recorder)

    def pop_recorder():
        _RECORDERS.remove(recorder)

    patcher.add_undo(pop_recorder)


class EmulationSession:
    """Handle returned by the context managers; read it inside or after the block."""

    def __init__(self, settings: Dict[str, Any]) -> None:
        self.settings = dict(settings)
        self._recorder = _AutotuneRecorder()

    def autotune_records(self) -> List[AutotuneRecord]:
        """Every (kernel, tuning key) decision taken in the block, in order."""
        return self._recorder.records()

    def chosen_configs(self) -> Dict[str, List[Dict[str, Any]]]:
        """kernel name -> list of chosen configs (one per distinct tuning key)."""
        out: Dict[str, List[Dict[str, Any]]] = {}
        for r in self._recorder.records():
            out.setdefault(r.kernel, []).append({
                **r.config, "num_warps": r.num_warps, "num_stages": r.num_stages, "index": r.index, "key": r.key
            })
        return out

    def configs_summary(self) -> str:
        """Compact one-line string for a result row."""
        return ";".join(sorted({r.short() for r in self._recorder.records()}))


@contextlib.contextmanager
def pinned_autotune(rule: AutotuneRule = "first") -> Iterator[EmulationSession]:
    """Deterministic autotune config choice, for native *and* emulated runs.

    Inside the block every ``triton.autotune`` kernel runs the config picked by
    ``rule`` ("first": first config left after the kernel's own pruning, in
    declaration order; "last"; or ``callable(candidates, nargs, kwargs)``)
    without benchmarking.  ``session.autotune_records()`` lists the choices.
    """
    session = EmulationSession({"autotune_rule": rule if isinstance(rule, str) else "callable"})
    with _LOCK:
        patcher = _Patcher()
        try:
            _install_autotune_pin(patcher, rule, session._recorder)
            yield session
        finally:
            patcher.restore()


# --------------------------------------------------------------------------
# 2-5. Interpreter numerics
# --------------------------------------------------------------------------


def _tensor_range(range_fn, *args, **kwargs):
    """Iterate a kernel ``range``/``tl.range`` loop yielding scalar tensors.

    Compiled Triton's induction variable is an int32 scalar (int64 when a bound
    is int64 or does not fit int32); the interpreter's is a Python int, so
    ``i.to(tl.int64)`` fails.  We yield interpreter tensors of the same type.
    """
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    r = range_fn(*args, **kwargs)
    if not isinstance(r, range):
        yield from r
        return
    wide = any(isinstance(a, tl.tensor) and a.dtype in (tl.int64, tl.uint64) for a in args)
    wide = wide or not all(-2**31 <= v < 2**31 for v in (r.start, r.stop, r.step))
    ty, npty = (tl.int64, np.int64) if wide else (tl.int32, np.int32)
    for i in r:
        yield tl.tensor(TensorHandle(np.array([i], dtype=npty), ty), ty)


class _InductionVarTransformer(ast.NodeTransformer):
    """``for x in range(...)`` / ``for x in tl.range(...)`` ->
    ``for x in __import__(<this module>)._tensor_range(range, ...)``.

    ``static_range`` is left alone (its variable is a constexpr when compiled).
    ``__import__`` keeps the kernel module's globals untouched.
    """

    def visit_For(self, node):
        self.generic_visit(node)
        it = node.iter
        if isinstance(it, ast.Call):
            f = it.func
            is_range = (isinstance(f, ast.Name) and f.id == "range") or (isinstance(f, ast.Attribute)
                                                                            and f.attr == "range")
            if is_range:
                mod = ast.Call(func=ast.Name(id="__import__", ctx=ast.Load()), args=[ast.Constant(value=__name__)],
                               keywords=[
                                   ast.keyword(arg="fromlist",
                                               value=ast.List(elts=[ast.Constant(value="_tensor_range")],
                                                              ctx=ast.Load()))
                               ])
                helper = ast.Attribute(value=mod, attr="_tensor_range", ctx=ast.Load())
                node.iter = ast.copy_location(ast.Call(func=helper, args=[f, *it.args], keywords=it.keywords), it)
        return node


_EMU_REWRITTEN: Dict[Callable, Callable] = {}


def _make_rewriter_cls():
    from triton.runtime.interpreter import FunctionRewriter

    class _EmuFunctionRewriter(FunctionRewriter):

        def _transform_ast(self, src):
            tree = super()._transform_ast(src)
            tree = _InductionVarTransformer().visit(tree)
            ast.fix_missing_locations(tree)
            return tree

    return _EmuFunctionRewriter


def _install_induction_vars(patcher: _Patcher) -> None:
    from triton.runtime.interpreter import InterpretedFunction

    rewriter_cls = _make_rewriter_cls()

    def rewrite(self):
        # Separate cache: the stock InterpretedFunction.rewritten_fn cache keeps
        # the unmodified rewrite for use outside the block.
        fn = _EMU_REWRITTEN.get(self.fn)
        if fn is None:
            fn = rewriter_cls(self.fn, **self.kwargs).rewrite_ast()
            _EMU_REWRITTEN[self.fn] = fn
        return fn

    patcher.set_attr(InterpretedFunction, "rewrite", rewrite)


def _precision_name(p) -> str:
    s = str(getattr(p, "name", p)).lower()
    return {"tf32x3": "tf32x3", "tf32": "tf32", "ieee": "ieee"}.get(s, s)


def _install_numerics(patcher: _Patcher, *, bf16: bool, dots: bool, force_dot_precision: Optional[str],
                      tf32_rounding: str) -> None:
    import triton.language as tl
    import triton.runtime.interpreter as interp
    from triton._C.libtriton import ir as _ir

    TensorHandle = interp.TensorHandle
    builder = interp.interpreter_builder
    BF16 = tl.bfloat16

    def is_bf16(h) -> bool:
        return h.dtype.scalar == BF16

    def real(h) -> np.ndarray:
        """Handle data -> float values (bf16 decoded, fp8 via the interpreter's converter)."""
        t = h.dtype.scalar
        if t == BF16:
            return bf16_bits_to_f32(h.data)
        if t.is_floating() and t.primitive_bitwidth == 8:
            return interp._convert_float(h.data, t, tl.float16, None).view(np.float16).astype(np.float32)
        return h.data

    def encode(values: np.ndarray, t, rounding: str = "rne") -> np.ndarray:
        """float values -> storage for scalar type t (bf16 bits, or numpy dtype)."""
        if t == BF16:
            if values.dtype == np.float64 or values.dtype.kind in "iu":
                return _f64_to_bf16_bits(values.astype(np.float64), rounding)
            return f32_to_bf16_bits(values.astype(np.float32), rounding)
        return values.astype(interp._get_np_dtype(t))

    if bf16:
        orig_binary = builder.binary_op

        def binary_op(lhs, rhs, op):
            # bf16 lives as uint16 bits; numpy would add/compare the bits.
            # Evaluate on the float32 values and round back (RNE) once.
            if is_bf16(lhs) and is_bf16(rhs):
                out = op(bf16_bits_to_f32(lhs.data), bf16_bits_to_f32(rhs.data))
                if out.dtype != np.bool_:
                    out = f32_to_bf16_bits(out)
                return TensorHandle(out, lhs.dtype.scalar)
            return orig_binary(lhs, rhs, op)

        orig_unary = builder.unary_op

        def unary_op(arg, op):
            # neg/exp/log/sqrt/floor/... on bf16: compute in float32, round RNE
            # (Triton upcasts bf16 math to f32 and truncs back with cvt.rn).
            if is_bf16(arg):
                return TensorHandle(f32_to_bf16_bits(op(bf16_bits_to_f32(arg.data))), arg.dtype.scalar)
            return orig_unary(arg, op)

        orig_ternary = builder.ternary_op

        def ternary_op(lhs, rhs, other, op):
            # clamp on bf16 bits would order negative numbers wrongly.
            # (np.where/select only moves bits and needs no fix.)
            if op is np.clip and is_bf16(other):
                out = np.clip(bf16_bits_to_f32(lhs.data), bf16_bits_to_f32(rhs.data), bf16_bits_to_f32(other.data))
                return TensorHandle(f32_to_bf16_bits(out), other.dtype.scalar)
            return orig_ternary(lhs, rhs, other, op)

        orig_fma = builder.create_fma

        def create_fma(x, y, z):
            # bf16 fma: exact product+sum in float64, one rounding to bf16.
            if is_bf16(z):
                xs, ys, zs = np.broadcast_arrays(real(x), real(y), real(z))
                out = xs.astype(np.float64) * ys + zs
                return TensorHandle(_f64_to_bf16_bits(out), z.dtype.scalar)
            return orig_fma(x, y, z)

        def _wrap_f32(name):
            orig = getattr(builder, name)

            def fn(arg):
                # Ops that bypass unary_op (rsqrt, erf) would see bf16 bits.
                if is_bf16(arg):
                    res = orig(TensorHandle(bf16_bits_to_f32(arg.data), tl.float32))
                    return TensorHandle(f32_to_bf16_bits(res.data), arg.dtype.scalar)
                return orig(arg)

            return fn

        orig_cast = builder.cast_impl

        def cast_impl(src, dst_type):
            # The stock cast truncates f32->bf16 and applies numpy astype to the
            # raw bits for every other bf16 pair (bf16<->f64/f16/int).  GPU
            # casts to bf16 round to nearest even.
            st, dt = src.dtype.scalar, dst_type.scalar
            if st == BF16 and dt == BF16:
                return TensorHandle(src.data.copy(), dt)
            if st == BF16:
                vals = bf16_bits_to_f32(src.data)
                if dt.is_int():  # fptosi/fptoui truncate toward zero
                    with np.errstate(invalid="ignore"):
                        return TensorHandle(vals.astype(interp._get_np_dtype(dt)), dt)
                return TensorHandle(encode(vals, dt), dt)
            if dt == BF16:
                return TensorHandle(encode(np.asarray(src.data), dt), dt)
            return orig_cast(src, dst_type)

        orig_fp_to_fp = builder.create_fp_to_fp

        def create_fp_to_fp(src, dst_type, rounding_mode):
            # Explicit-rounding casts: the interpreter's RTNE rounds ties up.
            st, dt = src.dtype.scalar, dst_type.scalar
            plain = (tl.float16, tl.float32, tl.float64, BF16)
            if (st == BF16 or dt == BF16) and st in plain and dt in plain:
                mode = "rtz" if rounding_mode == _ir.ROUNDING_MODE.RTZ else "rne"
                vals = real(src) if st == BF16 else np.asarray(src.data)
                if dt == BF16:
                    return TensorHandle(encode(vals, dt, mode), dt)
                return TensorHandle(vals.astype(interp._get_np_dtype(dt)), dt)
            return orig_fp_to_fp(src, dst_type, rounding_mode)

        for name, fn in (("binary_op", binary_op), ("unary_op", unary_op), ("ternary_op", ternary_op),
                         ("create_fma", create_fma), ("cast_impl", cast_impl), ("create_fp_to_fp", create_fp_to_fp),
                         ("create_rsqrt", _wrap_f32("create_rsqrt")), ("create_erf", _wrap_f32("create_erf"))):
            patcher.set_attr(builder, name, fn)

        # Reductions/scans: the interpreter calls np.sum/np.cumsum/nanmax on
        # the bf16 bits.  Swap the module-level classes its tl.reduce /
        # tl.associative_scan replacements instantiate.
        base_reduce, base_scan = interp.ReduceOps, interp.ScanOps

        class _BF16ReduceOps(base_reduce):

            def sum(self, input):
                if input.dtype != BF16:
                    return super().sum(input)
                x = bf16_bits_to_f32(input.handle.data)
                axis = self.axis
                if axis is None:
                    x, ax = x.ravel(), 0
                else:
                    ax = axis
                x = np.moveaxis(x, ax, -1)
                while x.shape[-1] > 1:  # pairwise tree, RNE after each add
                    n = x.shape[-1]
                    h = n // 2
                    s = _round_bf16_f32(x[..., :h] + x[..., h:2 * h])
                    x = np.concatenate([s, x[..., 2 * h:]], axis=-1) if n % 2 else s
                res = x[..., 0]
                if self.keep_dims:
                    if axis is None:
                        res = np.reshape(res, (1, ) * input.handle.data.ndim)
                    else:
                        res = np.expand_dims(res, axis)
                elif axis is None:
                    res = res.reshape(())
                bits = f32_to_bf16_bits(res)
                return self.to_tensor(bits if bits.ndim else bits.item(), input.dtype)

            def min_max(self, input, val_reduce_op, idx_reduce_op=None):
                inp = input[0] if isinstance(input, tuple) else input
                if inp.dtype != BF16 or val_reduce_op is None:
                    return super().min_max(input, val_reduce_op, idx_reduce_op)
                x = bf16_bits_to_f32(inp.handle.data)
                vals = f32_to_bf16_bits(np.asarray(val_reduce_op(x, axis=self.axis, keepdims=self.keep_dims)))
                val = self.to_tensor(vals if vals.ndim else vals.item(), inp.dtype)
                if idx_reduce_op is None:
                    return val
                idx = self.to_tensor(idx_reduce_op(x, axis=self.axis, keepdims=self.keep_dims), tl.int32)
                return val, idx

        class _BF16ScanOps(base_scan):

            def _seq(self, input, op):
                x = np.moveaxis(bf16_bits_to_f32(input.handle.data), self.axis, 0).copy()
                for i in range(1, x.shape[0]):  # sequential, RNE after each step
                    x[i] = _round_bf16_f32(op(x[i - 1], x[i]))
                return [self.to_tensor(f32_to_bf16_bits(np.moveaxis(x, 0, self.axis)), input.dtype)]

            def cumsum(self, input):
                return self._seq(input, np.add) if input.dtype == BF16 else super().cumsum(input)

            def cumprod(self, input):
                return self._seq(input, np.multiply) if input.dtype == BF16 else super().cumprod(input)

        patcher.set_attr(interp, "ReduceOps", _BF16ReduceOps)
        patcher.set_attr(interp, "ScanOps", _BF16ScanOps)

    if dots:
        orig_dot = builder.create_dot
        P = _ir.INPUT_PRECISION
        forced = None if force_dot_precision is None else getattr(
            P, {"tf32": "TF32", "tf32x3": "TF32x3", "ieee": "IEEE"}[force_dot_precision])

        def tf32(x):
            return round_to_tf32(x, tf32_rounding).astype(np.float64)

        def mm(a, b):
            # float64 matmul of values with <= 24-bit significands: products are
            # exact; the K-sum carries 53 bits, far below the f32 rounding below.
            return np.matmul(a, b)

        def create_dot(a, b, d, input_precision, max_num_imprecise_acc):
            at, bt = a.dtype.scalar, b.dtype.scalar
            if not (at.is_floating() and bt.is_floating()):
                return orig_dot(a, b, d, input_precision, max_num_imprecise_acc)  # integer dots are exact
            dt = d.dtype.scalar
            acc = real(d).astype(np.float64)
            A, B = real(a), real(b)
            if at == tl.float32 and bt == tl.float32:
                prec = forced if forced is not None else input_precision
                if prec == P.IEEE:
                    # FMA chain over k in float32, like the non-tensor-core lowering.
                    out = acc.astype(np.float32)
                    A64, B64 = A.astype(np.float64), B.astype(np.float64)
                    for k in range(A.shape[-1]):
                        out = (A64[..., :, k:k + 1] * B64[..., k:k + 1, :] + out).astype(np.float32)
                    return TensorHandle(encode(out, dt), dt)
                if prec == P.TF32x3:
                    # Triton F32DotTC: big = cvt.rna(x), small = x - big (exact in f32).
                    a_big, b_big = round_to_tf32(A, "rna"), round_to_tf32(B, "rna")
                    a_small, b_small = (A - a_big).astype(np.float32), (B - b_big).astype(np.float32)
                    p1 = mm(tf32(a_small), b_big.astype(np.float64)).astype(np.float32)
                    p2 = (mm(a_big.astype(np.float64), tf32(b_small)) + p1).astype(np.float32)
                    p2 = np.where(np.isnan(p2), np.float32(0), p2)
                    out = mm(a_big.astype(np.float64), b_big.astype(np.float64)) + p2 + acc
                    return TensorHandle(encode(out, dt), dt)
                if prec == P.TF32:
                    out = mm(tf32(A), tf32(B)) + acc
                    return TensorHandle(encode(out, dt), dt)
                if prec in (P.BF16x3, P.BF16x6):
                    # split each operand into bf16 pieces (round to nearest even) and sum the
                    # cross products of low total order, smallest first, each pass f32-accumulated
                    n, pairs = (2, ((1, 0), (0, 1), (0, 0))) if prec == P.BF16x3 else \
                        (3, ((2, 0), (1, 1), (0, 2), (1, 0), (0, 1), (0, 0)))
                    pa, pb = _bf16_pieces(A, n), _bf16_pieces(B, n)
                    out = acc.astype(np.float32)
                    for i, j in pairs:
                        out = (mm(pa[i], pb[j]) + out).astype(np.float32)
                    return TensorHandle(encode(out, dt), dt)
                return orig_dot(a, b, d, input_precision, max_num_imprecise_acc)
            # bf16 / fp16 / fp8 inputs: exact products, float32 (output-type) accumulation.
            out = mm(A.astype(np.float64), B.astype(np.float64)) + acc
            return TensorHandle(encode(out, dt), dt)

        patcher.set_attr(builder, "create_dot", create_dot)
        # the NVIDIA backend also accepts bf16x3 / bf16x6 (fla's kda safe-gate path asks for them)
        patcher.set_attr(builder, "options", dataclasses.replace(
            builder.options, allowed_dot_input_precisions=("tf32", "tf32x3", "ieee", "bf16x3", "bf16x6")))


def _bf16_pieces(x: np.ndarray, n: int) -> List[np.ndarray]:
    """f32 ``x`` as ``n`` bf16 pieces (each rounded to nearest even) whose sum approximates it."""
    out, rest = [], x.astype(np.float32)
    for _ in range(n):
        piece = bf16_bits_to_f32(f32_to_bf16_bits(rest))
        out.append(piece.astype(np.float64))
        rest = (rest - piece).astype(np.float32)
    return out


def _install_fla_gather_fallback(patcher: _Patcher) -> List[str]:
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


@contextlib.contextmanager
def triton_emulation(dot_precision: Optional[str] = None, *, force_dot_precision: bool = False,
                     tf32_rounding: str = "truncate", autotune_rule: AutotuneRule = "first", bf16: bool = True,
                     dots: bool = True, loop_tensors: bool = True,
                     autotune: bool = True) -> Iterator[EmulationSession]:
    """Scoped H100-like numerics for the Triton interpreter (see module doc).

    dot_precision: default ``input_precision`` for float32 ``tl.dot`` in the
        block ("tf32", "tf32x3", "ieee"), i.e. TRITON_F32_DEFAULT for the block.
        None keeps the process setting (TRITON_F32_DEFAULT, else "tf32").
    force_dot_precision: apply ``dot_precision`` even to dots that set
        ``input_precision``/``allow_tf32`` explicitly.
    tf32_rounding: "truncate" (H100 tensor core on raw fp32), "rne" or "rna".
    autotune_rule: see :func:`pinned_autotune`.
    bf16 / dots / loop_tensors / autotune: switch individual fixes off (for
        demonstrating the stock interpreter's behaviour).

    Yields an :class:`EmulationSession` (``autotune_records()``,
    ``chosen_configs()``, ``configs_summary()``, ``settings``).  Raises
    RuntimeError outside interpreter mode, so a native run is never altered.
    Not thread-safe with respect to other interpreter use; re-entrant.
    """
    if not interpreter_mode_enabled():
        raise RuntimeError("triton_emulation() needs Triton interpreter mode (TRITON_INTERPRET=1 set before "
                           "importing triton/fla; see enable_interpreter_mode()). For native runs use "
                           "pinned_autotune().")
    if dot_precision is not None and dot_precision not in DOT_PRECISIONS:
        raise ValueError(f"dot_precision must be one of {DOT_PRECISIONS} or None, got {dot_precision!r}")
    if force_dot_precision and dot_precision is None:
        raise ValueError("force_dot_precision=True needs dot_precision")
    if tf32_rounding not in TF32_ROUNDINGS:
        raise ValueError(f"tf32_rounding must be one of {TF32_ROUNDINGS}, got {tf32_rounding!r}")
    import triton

    effective = dot_precision or triton.knobs.language.fp32_default or "tf32"
    session = EmulationSession({
        "mode": "triton-interpreter-emulation",
        "dot_precision": effective,
        "dot_precision_forced": bool(force_dot_precision),
        "tf32_rounding": tf32_rounding,
        "bf16_rounding": "rne" if bf16 else "stock-interpreter",
        "dot_accumulation": "exact-products-f32" if dots else "stock-interpreter",
        "loop_induction_tensors": bool(loop_tensors),
        "autotune_rule": (autotune_rule if isinstance(autotune_rule, str) else "callable") if autotune else "stock",
    })
    with _LOCK:
        patcher = _Patcher()
        try:
            if autotune:
                _install_autotune_pin(patcher, autotune_rule, session._recorder)
            if loop_tensors:
                _install_induction_vars(patcher)
            _install_numerics(patcher, bf16=bf16, dots=dots,
                              force_dot_precision=dot_precision if force_dot_precision else None,
                              tf32_rounding=tf32_rounding)
            session.settings["fla_gather_disabled_in"] = _install_fla_gather_fallback(patcher)
            if dot_precision is not None:
                # core.dot resolves input_precision=None from this knob at every
                # interpreted call, exactly like TRITON_F32_DEFAULT at compile
                # time.  Setting the knob also exports the env var: undo both.
                lang = triton.knobs.language
                had = vars(lang).get("fp32_default", _MISSING)
                patcher.set_env("TRITON_F32_DEFAULT", os.environ.get("TRITON_F32_DEFAULT"))
                lang.fp32_default = dot_precision

                def undo_knob(lang=lang, had=had):
                    if had is _MISSING:
                        vars(lang).pop("fp32_default", None)
                    else:
                        vars(lang)["fp32_default"] = had

                patcher.add_undo(undo_knob)
            yield session
        finally:
            patcher.restore()
