"""The gated delta rule's chunk maths, shared by the chunked kernels of kda (:mod:`kernels_tpu.kda.chunk`), gdn2
(:mod:`kernels_tpu.gdn2.chunk`) and gdn (kda with one decay per head), and by their decode kernels: the kernel dot
through the precision policy, the decayed pairwise scores and their transposes on sub-chunks, the unit lower
triangular inverse, the chunk step and its backward, and the in-kernel options (q/k L2 norm, the gate from A_log
and dt_bias, beta's sigmoid) applied as float32 jax ops before the kernels. The maths, the chunk form and the gate
stability argument are written out in :mod:`kernels_tpu.kda.chunk`."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from kernels_tpu import mxu
from kernels_tpu.common import causal_mask, iota, masked_exp

F32 = jnp.float32
NN, TN, NT_T = mxu.NN, mxu.TN, mxu.NT_T  # a @ b, a.T @ b, a @ b.T (kernels_tpu.mxu)
L2NORM_EPS = 1e-6  # as fla l2norm_fwd (its eps when none is given)


# ============================================================ in-kernel maths
def dot(a, b, dims=NN, *, policy: mxu.Policy):
    """A kernel dot through the one precision policy (operands here are f32: see ``load``)."""
    return policy.dot(a, b, dims)


def diag_decay(G_i, strict: bool):
    """exp(G_r - G_s) on one diagonal sub-chunk, [bc, bc, K]; exponent masked before exp."""
    mask = causal_mask(G_i.shape[0], strict=strict, trailing=1)
    return masked_exp(G_i[:, None, :] - G_i[None, :, :], mask)


def pair_scores(a, b, G, *, strict: bool, bc: int, policy: mxu.Policy):
    """P[r,s] = sum_d a[r,d] b[s,d] exp(G[r,d]-G[s,d]) for s<r (strict) or s<=r, else 0. [C,C]."""
    C = a.shape[0]
    rows = []
    for i in range(C // bc):
        r0 = i * bc
        a_i, G_i = a[r0:r0 + bc], G[r0:r0 + bc]
        parts = []
        if r0:
            ref = G[r0:r0 + 1]
            a_n = a_i * jnp.exp(G_i - ref)
            b_n = b[:r0] * jnp.exp(ref - G[:r0])
            parts.append(dot(a_n, b_n, NT_T, policy=policy))
        e = diag_decay(G_i, strict)
        parts.append(jnp.sum(a_i[:, None, :] * b[r0:r0 + bc][None, :, :] * e, axis=-1))
        if r0 + bc < C:
            parts.append(jnp.zeros((bc, C - r0 - bc), F32))
        rows.append(jnp.concatenate(parts, axis=1) if len(parts) > 1 else parts[0])
    return jnp.concatenate(rows, axis=0)


def pair_rows(dP, b, G, *, strict: bool, bc: int, policy: mxu.Policy):
    """X[r] = sum_s dP[r,s] b[s] exp(G[r]-G[s]) over the causal pairs. [C,K]."""
    C = b.shape[0]
    rows = []
    for i in range(C // bc):
        r0 = i * bc
        G_i = G[r0:r0 + bc]
        e = diag_decay(G_i, strict)
        x = jnp.sum(dP[r0:r0 + bc, r0:r0 + bc][:, :, None] * b[r0:r0 + bc][None, :, :] * e, axis=1)
        if r0:
            ref = G[r0:r0 + 1]
            b_n = b[:r0] * jnp.exp(ref - G[:r0])
            x = x + dot(dP[r0:r0 + bc, :r0], b_n, policy=policy) * jnp.exp(G_i - ref)
        rows.append(x)
    return jnp.concatenate(rows, axis=0)


def pair_cols(dP, a, G, *, strict: bool, bc: int, policy: mxu.Policy):
    """Y[s] = sum_r dP[r,s] a[r] exp(G[r]-G[s]) over the causal pairs. [C,K]."""
    C, K = a.shape
    diag = []
    for i in range(C // bc):
        r0 = i * bc
        e = diag_decay(G[r0:r0 + bc], strict)
        diag.append(jnp.sum(dP[r0:r0 + bc, r0:r0 + bc][:, :, None] * a[r0:r0 + bc][:, None, :] * e, axis=0))
    y = jnp.concatenate(diag, axis=0)
    for i in range(1, C // bc):
        r0 = i * bc
        ref = G[r0:r0 + 1]
        a_n = a[r0:r0 + bc] * jnp.exp(G[r0:r0 + bc] - ref)
        part = dot(dP[r0:r0 + bc, :r0], a_n, TN, policy=policy) * jnp.exp(ref - G[:r0])
        y = y + jnp.concatenate([part, jnp.zeros((C - r0, K), F32)], axis=0)
    return y


def inverse_grad(Tm, dTm, *, policy: mxu.Policy):
    """Gradient through Tm = (I + L)^{-1}: dL = -Tm^T dTm Tm^T (the caller keeps its strictly lower part)."""
    return -dot(dot(Tm, dTm, TN, policy=policy), Tm, NT_T, policy=policy)


def unit_lower_inverse(L, *, policy: mxu.Policy):
    """(I + L)^{-1} for strictly lower-triangular L by forward substitution, one row per step:
    row r = e_r - L[r, :] @ Tm (rows >= r of Tm are still those of I, and L[r, s>=r] = 0)."""
    C = L.shape[0]
    rid, cid = iota((C, C), 0), iota((C, C), 1)
    eye = (rid == cid).astype(F32)

    def body(r, Tm):
        sel = rid == r
        l_r = jnp.sum(jnp.where(sel, L, 0.0), axis=0, keepdims=True)  # [1, C]
        e_r = jnp.sum(jnp.where(sel, eye, 0.0), axis=0, keepdims=True)
        row = e_r - dot(l_r, Tm, policy=policy)
        return jnp.where(sel, row, Tm)

    return lax.fori_loop(1, C, body, eye)


# ============================================================ the delta-rule chunk step (kda's and gdn2's)
# kda and gdn2 (kernels_tpu.gdn2.chunk) run the same chunk once their intra-chunk quantities are formed: the
# decayed erase keys kw and the written values x (kda: beta k exp G and beta v; gdn2: b k exp G and w v), the
# inverse Tm = (I + L)^{-1}, W = Tm kw and U = Tm x. They differ only in how L is made from the keys, so each
# kernel does the chain rule back through L and kw itself, between chunk_step_grads and chunk_qkg_grads.
def chunk_step(q, k, G, S, eG, W, U, Aqk, *, scale, policy: mxu.Policy):
    """One chunk's output and the state it hands on, from the state S entering it::

        dlt = U - W S                                the new values
        o   = scale (q * exp G) S + Aqk dlt
        S'  = exp(G_C) * S + (k * exp(G_C - G))^T dlt

    Returns (o, S')."""
    C = G.shape[0]
    dlt = U - dot(W, S, policy=policy)
    o = scale * dot(q * eG, S, policy=policy) + dot(Aqk, dlt, policy=policy)
    G_last = G[C - 1:C]  # [1, K]
    kdec = k * jnp.exp(G_last - G)
    S_new = jnp.exp(G_last).T * S + dot(kdec, dlt, TN, policy=policy)
    return o, S_new


class StepGrads(NamedTuple):
    """:func:`chunk_step_grads`: the gradients the chunk step hands back, and the step's own terms that the key and
    gate gradients (:func:`chunk_qkg_grads`) reuse rather than recompute."""

    dS_prev: Any  # [K, V] the state entering the chunk
    dL: Any  # [C, C] through Tm = (I + L)^{-1}, strictly lower
    dx: Any  # [C, V] Tm^T dU: the written values'
    dkw: Any  # [C, K] Tm^T dW: the decayed erase keys'
    dAqk: Any  # [C, C] causal
    dqg: Any  # [C, K] of qg = q * exp G
    qg: Any
    dkdec: Any  # [C, K] of kdec = k * exp(G_C - G)
    kdec: Any
    dec_last: Any  # [1, K] exp(G_C)


def chunk_step_grads(q, k, G, S, dS, do, Tm, eG, kw, x, W, U, Aqk, *, scale, policy: mxu.Policy) -> StepGrads:
    """The transposes of :func:`chunk_step` (do, and dS the gradient of the state it hands on), then of
    U = Tm x, W = Tm kw and Tm = (I + L)^{-1}: up to dL, dx and dkw, where the two ops part."""
    pol = policy
    C = G.shape[0]
    dlt = U - dot(W, S, policy=pol)
    G_last = G[C - 1:C]
    dec_last = jnp.exp(G_last)  # [1, K]
    kdec = k * jnp.exp(G_last - G)
    qg = q * eG

    # o = scale qg S + Aqk dlt ;  S' = dec_last^T * S + kdec^T dlt
    d_dlt = dot(Aqk, do, TN, policy=pol) + dot(kdec, dS, policy=pol)  # Aqk^T do + kdec dS'
    dAqk = jnp.where(causal_mask(C), dot(do, dlt, NT_T, policy=pol), 0.0)
    dqg = scale * dot(do, S, NT_T, policy=pol)
    dkdec = dot(dlt, dS, NT_T, policy=pol)
    # dlt = U - W S
    dW = -dot(d_dlt, S, NT_T, policy=pol)
    dS_prev = (scale * dot(qg, do, TN, policy=pol) + dec_last.T * dS
               - dot(W, d_dlt, TN, policy=pol))
    # U = Tm x, W = Tm kw
    dTm = dot(d_dlt, x, NT_T, policy=pol) + dot(dW, kw, NT_T, policy=pol)
    dx = dot(Tm, d_dlt, TN, policy=pol)  # Tm^T dU
    dkw = dot(Tm, dW, TN, policy=pol)  # Tm^T dW
    # Tm = (I + L)^{-1}  ->  dL = -Tm^T dTm Tm^T (strictly lower part)
    dL = jnp.where(causal_mask(C, strict=True), inverse_grad(Tm, dTm, policy=pol), 0.0)
    return StepGrads(dS_prev, dL, dx, dkw, dAqk, dqg, qg, dkdec, kdec, dec_last)


def chunk_qkg_grads(q, k, G, S, dS, eG, kw, st: StepGrads, *, dk_L, dk_kw, dG_L, scale, bc: int,
                    policy: mxu.Policy):
    """dq, dk, dG: the query side (Aqk = scale pairs(q, k)) and the step's terms around the op's own, dk_L and
    dG_L (back through L) and dk_kw (back through kw)::

        dk = dk_L + yq + dk_kw + dkdec * exp(G_C - G)
        dG = dG_L + q * xq - k * yq + dkw * kw + dqg * qg - dkdec * kdec   (+ through G_C, on the last row)

    The sums run left to right in this order: the op's terms first, so each kernel's rounding is its own."""
    C = G.shape[0]
    dP = scale * st.dAqk
    xq = pair_rows(dP, k, G, strict=False, bc=bc, policy=policy)
    yq = pair_cols(dP, q, G, strict=False, bc=bc, policy=policy)
    G_last = G[C - 1:C]
    dq = xq + st.dqg * eG
    dk = dk_L + yq + dk_kw + st.dkdec * jnp.exp(G_last - G)
    dG = dG_L + q * xq - k * yq + st.dkw * kw + st.dqg * st.qg - st.dkdec * st.kdec
    dG_last = (jnp.sum(st.dkdec * st.kdec, axis=0, keepdims=True)
               + st.dec_last * jnp.sum(S * dS, axis=1, keepdims=True).T)
    dG = dG + jnp.where(iota((C, 1), 0) == C - 1, dG_last, 0.0)
    return dq, dk, dG


def load(ref):
    """A kernel operand loaded as float32 (every in-kernel dot takes f32 operands)."""
    return ref[...].astype(F32)


# ============================================================ around the kernels
def preprocess(q, k, g, beta, A_log, dt_bias, opts):
    """fla's in-kernel options as float32 jax ops (differentiable)."""
    if opts["use_qk_l2norm_in_kernel"]:
        # cast once: two casts of x would round two cotangent parts to x.dtype separately
        q, k = (xf * lax.rsqrt(jnp.sum(xf * xf, -1, keepdims=True) + L2NORM_EPS)
                for xf in (q.astype(F32), k.astype(F32)))
    g = g.astype(F32)
    if opts["use_gate_in_kernel"]:
        H, K = g.shape[-2:]
        x = g if dt_bias is None else g + dt_bias.astype(F32).reshape(H, K)
        if opts["lower_bound"] is None:
            g = -jnp.exp(A_log.astype(F32)).reshape(H, 1) * jax.nn.softplus(x)
        else:
            if A_log is not None:
                x = jnp.exp(A_log.astype(F32)).reshape(H, 1) * x
            g = opts["lower_bound"] * jax.nn.sigmoid(x)
    beta = beta.astype(F32)
    if opts["use_beta_sigmoid_in_kernel"]:
        beta = jax.nn.sigmoid(beta) * (2.0 if opts["allow_neg_eigval"] else 1.0)
    return q, k, g, beta


def chunk_cumsum(g, C):
    """Chunk-local inclusive cumsum over T of head-major g [B,H,T,K]."""
    B, H, T, K = g.shape
    return jnp.cumsum(g.reshape(B, H, T // C, C, K), axis=3).reshape(B, H, T, K)
