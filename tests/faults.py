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
    from kernels_tpu.kda.chunk import TN, _dot

    return -_dot(_dot(Tm, dTm, TN, policy=policy), Tm, policy=policy)
