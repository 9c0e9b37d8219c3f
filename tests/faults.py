"""Faulty versions of named kernel helpers, for the fault-injection tests (never shipped in kernels_tpu/).

Each reproduces an upstream bug class at the helper it lives in; tests swap it in with the
``inject`` fixture (tests/conftest.py).
"""

import jax
import jax.numpy as jnp


def unsafe_causal_decay(b_col, b_row):
    """exp of the UNMASKED gate difference, then a 0/1 mask: inf * 0 = NaN where b_i - b_j > 88.7.

    The mask comes from integer arithmetic, not convert(bool): XLA's simplifier turns
    x * convert(pred) back into a select, which would hide the fault.
    """
    BT = b_col.shape[0]
    i = jax.lax.broadcasted_iota(jnp.int32, (BT, BT), 0)
    j = jax.lax.broadcasted_iota(jnp.int32, (BT, BT), 1)
    return jnp.exp(b_col - b_row) * jnp.clip(i - j + 1, 0, 1).astype(jnp.float32)


@jax.custom_vjp
def zero_gradient(x):
    """Identity whose gradient is zero: a backward that "returns zeros" for this input."""
    return x


zero_gradient.defvjp(lambda x: (x, None), lambda _, g: (jnp.zeros_like(g),))


def first_k_tile_only(q, k, qg, S, *, policy):
    """gla fused forward's reduction over K that stops after the first 128-wide tile (o misses K >= 128)."""
    from kernels_tpu.gla.fused import LANES, NT_T, mm

    ks = slice(0, LANES)
    return mm(q[:, ks], k[:, ks], NT_T, policy=policy), mm(qg[:, ks], S[ks, :], policy=policy)


def inverse_grad_missing_transpose(Tm, dTm, *, policy):
    """kda's gradient through (I + L)^{-1} with one transpose dropped: -Tm^T dTm Tm instead of -Tm^T dTm Tm^T."""
    from kernels_tpu.delta_rule import TN, dot

    return -dot(dot(Tm, dTm, TN, policy=policy), Tm, policy=policy)


# ------------------------------------------------------------------ graded precision regressions
# Each class keeps ``bits`` fraction bits (round to nearest even) where a correct kernel keeps more:
# 23 is f32 (no regression), 10 fp16's, 7 bf16's. The power study (tests/power.py) finds the
# smallest regression of each class the shipped gate policy catches.

def round_fraction(x, bits: int):
    """``x`` (f32) rounded to nearest even at ``bits`` fraction bits, kept in f32; 23 returns x unchanged.
    At ``bits=7`` it equals a round trip through bfloat16. Its gradient is the identity, as a dtype round
    trip's is (the bit arithmetic alone would differentiate to zero where autodiff sees it)."""
    x = x.astype(jnp.float32)
    if bits >= 23:
        return x
    drop = 23 - bits
    u = jax.lax.bitcast_convert_type(x, jnp.uint32)
    keep_lsb = (u >> drop) & jnp.uint32(1)
    u = (u + jnp.uint32((1 << (drop - 1)) - 1) + keep_lsb) & jnp.uint32(~((1 << drop) - 1) & 0xFFFFFFFF)
    return x + jax.lax.stop_gradient(jax.lax.bitcast_convert_type(u, jnp.float32) - x)


def kernel_modules():
    """Every kernels_tpu module (the helpers below are patched wherever a kernel imported them)."""
    import importlib

    names = ["kernels_tpu.simple_gla.chunk", "kernels_tpu.simple_gla.fused_chunk", "kernels_tpu.gla.chunk",
             "kernels_tpu.gla.fused", "kernels_tpu.kda.chunk"]
    return [importlib.import_module(n) for n in names]


def state_rounded_per_chunk(bits: int):
    """``common.walk_pass`` whose kernels round the carried f32 state to ``bits`` after every grid step,
    so each chunk hands the next a rounded state (forward states and backward state gradients)."""
    from kernels_tpu import common

    real = common.walk_pass

    def faulty(kernel, *, tables, in_specs, out_specs, **kw):
        # the kernel's refs: the walk's tables, the inputs, the outputs, then the carried state
        first_scratch = len(tables) + len(in_specs) + (len(out_specs) if isinstance(out_specs, (list, tuple)) else 1)

        def rounded(*refs):
            kernel(*refs)
            state = refs[first_scratch]
            state[...] = round_fraction(state[...], bits)

        return real(rounded, tables=tables, in_specs=in_specs, out_specs=out_specs, **kw)

    return {"walk_pass": faulty}


def scores_rounded_twice(bits: int):
    """The intra-chunk scores rounded to ``bits`` where they are formed, before the decay or scale is
    applied, and then again as the next dot's operand: simple_gla (both variants), gla's g_gamma path, kda."""
    from kernels_tpu.gla import fused
    from kernels_tpu import delta_rule
    from kernels_tpu.simple_gla import chunk as sg_chunk

    def intra_scores(q, k, D, policy):
        return round_fraction(sg_chunk.mm(q, k, policy, sg_chunk.NT_T), bits) * D

    real_tiles, real_pairs = fused.k_tile_reduction, delta_rule.pair_scores

    def k_tile_reduction(*args, **kw):
        scores, o_inter = real_tiles(*args, **kw)
        return round_fraction(scores, bits), o_inter

    def pair_scores(*args, **kw):
        return round_fraction(real_pairs(*args, **kw), bits)

    return {"intra_scores": intra_scores, "k_tile_reduction": k_tile_reduction, "pair_scores": pair_scores}


def f32_dots_fewer_bits(bits: int):
    """The policy's f32-operand dots (BF16X3, BF16X4) fed operands rounded to ``bits`` first; 7 is one bf16 pass."""
    from kernels_tpu import mxu

    real = mxu.dot

    def dot(a, b, *, precision, **kw):
        if precision in (mxu.BF16X3, mxu.BF16X4):
            a, b = round_fraction(a, bits), round_fraction(b, bits)
        return real(a, b, precision=precision, **kw)

    return {"mxu.dot": dot}


def products_fewer_bits(bits: int):
    """The policy's f32-operand dots with every product rounded to ``bits`` before the f32 sum.

    A strong-decay fault: a product of two fp16 values is exact at 21 fraction bits, and fla's fp16 tensor
    cores keep it whole; under a strong decay each entry of the final state is about one such product
    (ht ~ k_T v_T^T), so fla's error there is ~1e-6 and a product kept at ~16 bits is seen. Elsewhere the
    state sums many decayed terms that fla rounds to fp16 (~2e-4), which hides the same fault. The three
    passes of BF16X3 drop ``lo*lo``, about 2^-16 of a product: this class at ~15 bits."""
    import jax.numpy as jnp_

    from kernels_tpu import mxu

    real = mxu.dot

    def dot(a, b, *, precision, preferred_element_type=jnp_.float32, dimension_numbers=mxu.NN, **kw):
        if precision not in (mxu.BF16X3, mxu.BF16X4):
            return real(a, b, precision=precision, preferred_element_type=preferred_element_type,
                        dimension_numbers=dimension_numbers, **kw)
        a, b = a.astype(jnp_.float32), b.astype(jnp_.float32)
        a = a.T if dimension_numbers == mxu.TN else a  # a [M, K]
        b = b.T if dimension_numbers == mxu.NT_T else b  # b [K, N]
        return jnp_.sum(round_fraction(a[:, :, None] * b[None, :, :], bits), axis=1).astype(preferred_element_type)

    return {"mxu.dot": dot}


def fp16_inputs_fewer_bits(bits: int):
    """fp16 inputs widened to f32 and then rounded to ``bits`` (fp16 keeps 10; 7 is fp16 through bf16)."""
    import jax.numpy as jnp_

    def widen_fp16(*xs):
        return tuple(round_fraction(x, bits) if x is not None and x.dtype == jnp_.float16 else x for x in xs)

    return {"mxu.widen_fp16": widen_fp16}


REGRESSIONS = {
    "state rounded per chunk": state_rounded_per_chunk,
    "scores rounded twice": scores_rounded_twice,
    "f32 dots at fewer bits": f32_dots_fewer_bits,
    "products at fewer bits": products_fewer_bits,
    "fp16 inputs at fewer bits": fp16_inputs_fewer_bits,
}
"""Graded regression classes: name -> (bits -> {helper name: faulty twin})."""


def apply_regression(setattr_, name: str, bits: int) -> list[str]:
    """Swap in regression ``name`` at ``bits`` with ``setattr_(module, attr, value)`` (a monkeypatch's
    setattr); returns the ``module.attr`` names patched. ``mxu.x`` names patch kernels_tpu.mxu itself,
    the others every kernel module that holds the helper."""
    from kernels_tpu import mxu

    patched = []
    for helper, twin in REGRESSIONS[name](bits).items():
        if helper.startswith("mxu."):
            targets = [(mxu, helper[4:])]
        else:
            targets = [(m, helper) for m in kernel_modules() if hasattr(m, helper)]
        for module, attr in targets:
            setattr_(module, attr, twin)
            patched.append(f"{module.__name__}.{attr}")
    return patched


def unsettled(result):
    """The comparisons a gate did not pass: its failures and, where one draw cannot decide, its inconclusive
    ones (harness.core.noise's sequential test). A fault is caught when it leaves one; more draws then decide it."""
    parity = result.parity
    return parity[parity["verdict"].isin(["fail", "inconclusive"])]


# ------------------------------------------------------------------ a binding that breaks its process
FAULTY = '''
"""A binding of this project's simple_gla kernel that breaks on the dtypes $FAULT_DTYPES names (default bfloat16),
in the way $FAULT picks."""
import os
import signal
import sys
import time

from harness.ops.base import LegBinding
from kernels_tpu.simple_gla import chunk_simple_gla

import jax

FAULT = os.environ["FAULT"]
BREAKS_ON = os.environ.get("FAULT_DTYPES", "bfloat16").split(",")


def _check_block(n):
    """A library's own check, a few calls deep (the traceback should show where)."""
    raise ValueError(f"block size {n} does not divide the sequence")


@jax.custom_vjp
def _interpret_stops_backward(x):
    return x


def _stop_on_cpu(residual, g):
    # as the Pallas interpreter stops a backward kernel a TPU compiles: the compile for a TPU answers "tpu"
    if jax.default_backend() == "cpu":
        raise RuntimeError("the interpreter cannot run this backward kernel")
    return (g,)


_interpret_stops_backward.defvjp(lambda x: (x, None), _stop_on_cpu)


def forward(case, a, ctx):
    if case.dtype in BREAKS_ON:
        print("faulty: about to break on", case.dtype, file=sys.stderr, flush=True)
        if FAULT == "exit":
            os._exit(7)  # a library that calls exit() on an input it dislikes
        if FAULT == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)  # a crash in a library's C++
        if FAULT == "hang":
            time.sleep(600)
        if FAULT == "device":
            raise NotImplementedError("Not supported on cpu.")  # tokamax's Op.__call__ off a TPU
        if FAULT == "raise":
            _check_block(case.chunk_size)
    o, ht = chunk_simple_gla(a["q"], a["k"], a["v"], g=a.get("g"), scale=case.resolved_scale,
                             initial_state=a.get("h0"), output_final_state=case.final_state,
                             chunk_size=case.chunk_size)
    if FAULT == "backward" and case.dtype in BREAKS_ON:
        o = _interpret_stops_backward(o)
    return {"o": o, "ht": ht}


class Impl:
    bindings = {"simple_gla": LegBinding(forward, differentiable=FAULT == "backward")}
    version = "faulty 1.0"


IMPLEMENTATION = Impl()
'''
"""The text of an outside implementation (written to a module and registered with --impl by the tests) whose
forward breaks on some cases: its process (exit, segfault, hang), a raised error (raise), the library's device
check (device) or the backward alone (backward): tests/test_faults.py, tests/test_workers.py,
tests/test_frictions.py."""
