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
   float32 inputs, while an H100 feeds TF32 to the tensor cores by default; and
   every dot is a float matmul, while a tensor core aligns, truncates and
   rounds toward zero in blocks of its own.
5. A comparison's handle carries its operands' type instead of int1, so a
   splatted scalar comparison becomes an int64 (etc.) mask that ``tl.load``
   rejects, and a cast of a bf16 comparison reads the bools as bf16 bits
   (``comparisons``).  Always fixed: it is not a numerics choice.

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
* scalar f32 (and bf16-evaluated-in-f32) arithmetic follows Triton's PTX for
  sm_80/sm_90 (``ptx_arith``): a multiply feeding an add or subtract is fused
  (one rounding), f32 ``/`` is ``div.full.f32`` (a product with the
  reciprocal), ``tl.sqrt`` is ``sqrt.approx.ftz.f32`` and ``tl.math.exp2`` is
  ``ex2.approx.ftz.f32`` (subnormal operands / results flushed to zero).
* f32 ``tl.sum``: in the order of the kernel's layout compiled for the ``tensor_core`` generation (``reduce_order``: a
  register tree, then the lanes' and warps' butterflies, read from the TTGIR and held against the PTX).
* bf16 reductions: pairwise tree with an RNE rounding after every add; bf16
  cumsum/cumprod: sequential with a rounding after every step.  The GPU's exact
  combine order depends on the layout and is not reproduced.
* casts to bf16 (from f32, f64, f16, ints) round to nearest even unless the
  kernel asks for ``fp_downcast_rounding="rtz"``.
* ``tl.dot`` on the tensor cores: every dot the GPU runs on its tensor cores
  (bf16/fp16 operands, and the TF32 / TF32x3 / BF16x3 / BF16x6 paths of f32
  dots below) is computed as the target generation's tensor core computes it
  (``tensor_core``: the bit-accurate model of Khattak and Mikaitis, arXiv
  2512.07004, reproduced bit for bit on their GPU measurements). K is cut into
  the hardware's blocks (sm_90: 16 bf16/fp16 or 8 TF32 products; sm_80: 8 / 4);
  in each block the exact products and the running f32 accumulator (the dot's
  ``acc`` first) are aligned to the largest exponent with 23 + 2 (sm_90) or
  23 + 1 (sm_80) fraction bits, truncated, added exactly, and the sum is
  normalised and rounded toward zero to f32; block after block. So a small term
  beside a large one loses its low bits, and no result is rounded to nearest.
  ``tensor_core="sm_90"`` (H100/H200) is the default, ``"sm_80"`` (A100) and
  ``"sm_100"`` (B200) are selectable. Not modelled: fp8 operands and f16
  accumulators (exact products, the K-sum rounded once).
* ``tl.dot`` with float32 inputs follows the dot's resolved ``input_precision``:

  - ``"tf32"``: inputs reduced to TF32 (10 explicit mantissa bits), then the
    tensor-core model.  How they are reduced is ``tf32_rounding``: default
    ``"truncate"``.
    Triton's tf32 lowering passes raw fp32 registers to ``mma``/``wgmma`` and
    the tensor core ignores the 13 low mantissa bits (truncation toward zero);
    see triton-lang/triton#4574, where inserting ``cvt.rna.tf32.f32`` was what
    made Triton match cuBLAS.  ``"rna"`` (ties away, = ``cvt.rna``) and
    ``"rne"`` (= what the interpreter uses for TMA descriptors and what cuBLAS
    /CUTLASS converters do) are available for sensitivity studies.
  - ``"tf32x3"``: Triton's F32DotTC decomposition as triton 3.9 compiles it:
    big = cvt.rna(x), small = x - big; d1 = small_a@big_b from a zero
    accumulator, d2 = big_a@small_b chained on d1, NaN replaced by 0,
    d3 = big_a@big_b chained on that, then ``acc`` added in one f32 rounding;
    each partial dot a TF32 tensor-core chain.  ``"bf16x3"`` / ``"bf16x6"``
    likewise with bf16 pieces (RNE) and bf16 chains.
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

import contextlib
import os
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from .batched_grid import DEFAULT_MAX_PROGRAMS, install_batched_grid, summarize
from .autotune import LOCK, AutotuneRecord, AutotuneRule, EmulationSession, install_autotune_pin, pinned_autotune
from .bf16_arith import install_bf16_arithmetic
from .bits import bf16_bits_to_f32, f32_to_bf16_bits, round_to_tf32
from .comparisons import install_int1_comparisons
from .dots import install_dot_numerics
from .fla_gather import install_fla_gather_fallback
from .loop_vars import install_induction_vars
from .patcher import MISSING, Patcher
from .ptx_arith import install_ptx_arithmetic
from .reduce_order import ReduceOrder, install as install_reduce_order
from .tensor_core import DEFAULT_ARCH, EMULATED_ARCHS
from .setup import (EMULATED_TRITON, emulation_problem, enable_interpreter_mode, interpreter_mode_enabled,  # noqa: F401
                    native_cuda_available, triton_versions)

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

DOT_PRECISIONS = ("tf32", "tf32x3", "ieee")
TF32_ROUNDINGS = ("truncate", "rne", "rna")


NOT_MODELLED = ("the GPU's MUFU functions: ex2.approx.f32 (tl.exp, fla's exp and exp2), rcp.approx (div.full) and "
                "sqrt.approx are numpy's correctly rounded float32 values here; PTX bounds their error, no document "
                "defines the function (reports/h200-native/reduce-order: the spread left on ht)")


@contextlib.contextmanager
def triton_emulation(dot_precision: Optional[str] = None, *, force_dot_precision: bool = False,
                     tf32_rounding: str = "truncate", tensor_core: str = DEFAULT_ARCH,
                     autotune_rule: AutotuneRule = "first", bf16: bool = True,
                     dots: bool = True, loop_tensors: bool = True, autotune: bool = True,
                     ptx_arith: bool = True, batched_grid: bool = True,
                     batched_grid_max_programs: int = DEFAULT_MAX_PROGRAMS,
                     reduce_order: bool = True, layouts_dir: Optional[Path] = None) -> Iterator[EmulationSession]:
    """Scoped H100-like numerics for the Triton interpreter (see module doc).

    dot_precision: default ``input_precision`` for float32 ``tl.dot`` in the
        block ("tf32", "tf32x3", "ieee"), i.e. TRITON_F32_DEFAULT for the block.
        None keeps the process setting (TRITON_F32_DEFAULT, else "tf32").
    force_dot_precision: apply ``dot_precision`` even to dots that set
        ``input_precision``/``allow_tf32`` explicitly.
    tf32_rounding: "truncate" (H100 tensor core on raw fp32), "rne" or "rna".
    tensor_core: the GPU generation whose tensor cores compute every dot that
        runs on them ("sm_90" H100, "sm_80" A100, "sm_100" B200; the
        ``tensor_core`` module's published model).
    autotune_rule: see :func:`pinned_autotune`.
    bf16 / dots / loop_tensors / autotune / ptx_arith: switch individual fixes
        off (for demonstrating the stock interpreter's behaviour).
    batched_grid: run every program of a launch together, one pass over the
        kernel (``batched_grid`` module: split where programs diverge, the
        stock sequential loop where a launch cannot be batched), bit for bit
        equal to the sequential loop; False keeps the stock loop (one pass per
        program), the reference the batched executor is compared with.
    batched_grid_max_programs: at most this many programs per pass (memory).
    reduce_order: float32 ``tl.sum`` adds in the order of the kernel's layout compiled for the ``tensor_core``
        generation (``reduce_order`` module); False keeps numpy's order (the stock interpreter's).
    layouts_dir: where the compiled layouts are kept between processes (``ReduceOrder``'s directory; None: the
        shipped table and this process's memory only, a miss compiled again in each process).

    ``session.grid_launches`` lists, per launch, how it ran (kernel, grid,
    mode batched/split/sequential, groups, reason); ``settings["grid_launches"]``
    counts them (updated as launches run).

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
    if tensor_core not in EMULATED_ARCHS:
        raise ValueError(f"tensor_core must be one of {EMULATED_ARCHS}, got {tensor_core!r}")
    import triton

    effective = dot_precision or triton.knobs.language.fp32_default or "tf32"
    session = EmulationSession({
        "mode": "triton-interpreter-emulation",
        "dot_precision": effective,
        "dot_precision_forced": bool(force_dot_precision),
        "tf32_rounding": tf32_rounding,
        "bf16_rounding": "rne" if bf16 else "stock-interpreter",
        "dot_accumulation": f"tensor-core-{tensor_core}" if dots else "stock-interpreter",
        "scalar_arith": "ptx" if ptx_arith else "stock-interpreter",
        "loop_induction_tensors": bool(loop_tensors),
        "autotune_rule": (autotune_rule if isinstance(autotune_rule, str) else "callable") if autotune else "stock",
        "batched_grid": bool(batched_grid),
        "reduce_order": f"compiled layout ({tensor_core})" if reduce_order else "stock-interpreter",
        # what no public document defines, so every row says the emulation takes a correctly rounded value there
        "not_modelled": NOT_MODELLED,
    })
    session.grid_launches = []

    def record_launch(rec, session=session):
        session.grid_launches.append(rec)
        session.settings["grid_launches"] = summarize(session.grid_launches)

    with LOCK:
        patcher = Patcher()
        try:
            if autotune:
                install_autotune_pin(patcher, autotune_rule, session._recorder)
            if loop_tensors:
                install_induction_vars(patcher)
            if bf16:
                install_bf16_arithmetic(patcher)
            if ptx_arith:  # after bf16: its fma and divisions go through bf16_arith's patches
                install_ptx_arithmetic(patcher)
            if dots:
                install_dot_numerics(patcher, force_dot_precision=dot_precision if force_dot_precision else None,
                                      tf32_rounding=tf32_rounding, tensor_core=tensor_core)
            if reduce_order:  # after bf16: a bf16 sum that finds no site keeps bf16_arith's tree
                order = ReduceOrder(tensor_core, layouts_dir)
                install_reduce_order(patcher, order)
                session.reduce_order = order
            install_int1_comparisons(patcher)  # not a numerics choice: the interpreter's own type slip
            session.settings["fla_gather_disabled_in"] = install_fla_gather_fallback(patcher)
            if dot_precision is not None:
                # core.dot resolves input_precision=None from this knob at every
                # interpreted call, exactly like TRITON_F32_DEFAULT at compile
                # time.  Setting the knob also exports the env var: undo both.
                lang = triton.knobs.language
                had = vars(lang).get("fp32_default", MISSING)
                patcher.set_env("TRITON_F32_DEFAULT", os.environ.get("TRITON_F32_DEFAULT"))
                lang.fp32_default = dot_precision

                def undo_knob(lang=lang, had=had):
                    if had is MISSING:
                        vars(lang).pop("fp32_default", None)
                    else:
                        vars(lang)["fp32_default"] = had

                patcher.add_undo(undo_knob)
            if batched_grid:  # last: it wraps the numerics patches above, outermost
                install_batched_grid(patcher, record_launch, batched_grid_max_programs)
            # A GPU computes exp2 of a masked-out exponent to inf without a word, and the kernel's mask drops it;
            # numpy's interpreter warns ("overflow encountered in exp2") on rows that end up finite. Every row
            # counts its own NaN and Inf, so nothing is hidden by keeping numpy as quiet as the hardware.
            with np.errstate(over="ignore", invalid="ignore"):
                yield session
        finally:
            patcher.restore()
