"""The short causal convolution in front of the delta rule (fla's ``causal_conv1d`` / ``ShortConvolution``), in
float32 jax ops: a depthwise convolution is W multiply-adds per element, no matrix unit work, so XLA's fused
elementwise code is what a TPU runs for it.

    y_t[d] = act( bias[d] + sum_{j<W} weight[d, j] * x_{t-(W-1)+j}[d] ),   x_t for t < 0 from the conv state

The state is the W-1 inputs before a sequence's first token, oldest first ([N, D, W-1]); the final state is
its last W-1 inputs. The output is rounded once to x's dtype, as fla's kernel stores it before the delta rule
reads it. Differentiable by autodiff.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["causal_conv1d"]


def _sequence(x, weight, bias, h0, activation):
    """x [L, D] float32, h0 [D, W-1] -> (y [L, D], final state [D, W-1]), float32."""
    L, W = x.shape[0], weight.shape[1]
    window = jnp.concatenate([h0.T, x])  # token t of the sequence sits at row t + W-1
    y = weight[:, 0] * window[:L]
    for j in range(1, W):  # oldest tap first, one rounding per multiply-add as the loop reads
        y = y + weight[:, j] * window[j:j + L]
    if bias is not None:
        y = y + bias
    if activation == "silu":
        y = y * jax.nn.sigmoid(y)
    return y, window[L:].T


def causal_conv1d(x, weight, bias=None, initial_state=None, activation="silu", *, cu_seqlens=None):
    """x [B, T, D]; weight [D, W]; bias [D] or None; initial_state [N, D, W-1] or None (zeros); ``cu_seqlens``
    the N+1 offsets of packed sequences (B = 1, a static tuple) or None (N = B).

    Returns (y [B, T, D] in x's dtype, final state [N, D, W-1] in x's dtype: the inputs it holds, exactly)."""
    B, T, D = x.shape
    W = weight.shape[1]
    spans = [(b, 0, T) for b in range(B)] if cu_seqlens is None else \
        [(0, bos, eos) for bos, eos in zip(cu_seqlens[:-1], cu_seqlens[1:])]
    f32 = lambda a: None if a is None else jnp.asarray(a).astype(jnp.float32)  # noqa: E731
    weight, bias = f32(weight), f32(bias)
    h0 = jnp.zeros((len(spans), D, W - 1), jnp.float32) if initial_state is None else f32(initial_state)
    ys, hts = [], []
    for i, (row, bos, eos) in enumerate(spans):
        y, ht = _sequence(f32(x[row, bos:eos]), weight, bias, h0[i], activation)
        ys.append(y)
        hts.append(ht)
    y = jnp.stack(ys) if cu_seqlens is None else jnp.concatenate(ys)[None]
    return y.astype(x.dtype), jnp.stack(hts).astype(x.dtype)
