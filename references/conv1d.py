"""Float64 CPU reference for the short causal convolution in front of the delta rule (fla's ``causal_conv1d``,
the op of its ``ShortConvolution`` layer), forward and backward.

Per channel d of ``x`` [B,T,D], with a kernel of width W (``weight`` [D,W]) and an optional ``bias`` [D]::

    y_t[d] = act( bias[d] + sum_{j=0}^{W-1} weight[d, j] * x_{t-(W-1)+j}[d] )

``x_t`` for t < 0 is the sequence's conv state: the W-1 inputs before its first token, oldest first
(``initial_state`` [N,D,W-1]; zeros when absent). The final state is the sequence's last W-1 inputs, with the
initial state in front when the sequence is shorter than W-1. ``act`` is the identity or SiLU,
``y * sigmoid(y)`` (fla's ``activation="silu"``, which its gated-delta-rule layers use).

The state holds W-1 inputs, the ones a continuation reads. fla's ``causal_conv1d`` lays its state out as [N,D,W]:
the same W-1 inputs in columns 1..W-1 and one more input in column 0 that no output reads (its forward kernel
loads columns ``o_x + W`` for ``o_x`` in [-(W-1), -1]); vLLM TPU's fused kernel keeps [slots, W-1, D]. The
harness's bindings map both onto this one.

Packed variable-length sequences (``cu_seqlens``, B = 1): each sequence convolves alone from its own
``initial_state[i]``; no output reads another sequence's inputs.

All work runs inside ``float64_cpu`` (:mod:`references._x64`); inputs of any float dtype are upcast exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ._varlen import num_states, offsets
from ._x64 import as_arrays, check_compute_dtype, float64_cpu, reference_jit, to_jax, to_numpy

__all__ = ["causal_conv1d", "causal_conv1d_bwd", "ACTIVATIONS"]

ACTIVATIONS = (None, "silu")


def _check(x, weight, bias, initial_state, activation, offs):
    if x.ndim != 3:
        raise ValueError(f"x must be [B,T,D], got shape {x.shape}")
    B, T, D = x.shape
    if weight.ndim != 2 or weight.shape[0] != D or weight.shape[1] < 2:
        raise ValueError(f"weight must be [D={D}, W] with W >= 2, got shape {weight.shape}")
    if bias is not None and bias.shape != (D,):
        raise ValueError(f"bias must be [D={D}], got shape {bias.shape}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r} must be one of {ACTIVATIONS}")
    if offs is not None and (B != 1 or offs[0] != 0 or offs[-1] != T or any(b < a for a, b in zip(offs, offs[1:]))):
        raise ValueError(f"cu_seqlens {offs} must rise from 0 to T={T} over one batch row (B=1, got B={B})")
    want = (num_states(B, offs), D, weight.shape[1] - 1)
    if initial_state is not None and initial_state.shape != want:
        raise ValueError(f"initial_state must be [N, D, W-1] = {list(want)}, got shape {initial_state.shape}")


def _one(x, weight, bias, h0, activation):
    """One sequence: x [L,D], h0 [D,W-1] -> (y [L,D], final state [D,W-1])."""
    W = weight.shape[1]
    L = x.shape[0]
    padded = jnp.concatenate([h0.T, x])  # [W-1+L, D]: token t of the sequence is row t + W-1
    y = sum(weight[:, j] * padded[j:j + L] for j in range(W))
    if bias is not None:
        y = y + bias
    if activation == "silu":
        y = y * jax.nn.sigmoid(y)
    return y, padded[L:].T


def _forward(x, weight, bias, h0, activation, offs):
    """x [B,T,D], h0 [N,D,W-1] -> (y [B,T,D], ht [N,D,W-1]), in x's dtype."""
    spans = [(b, (0, x.shape[1])) for b in range(x.shape[0])] if offs is None else \
        [(0, span) for span in zip(offs[:-1], offs[1:])]
    ys, hts = [], []
    for i, (row, (bos, eos)) in enumerate(spans):
        y, ht = _one(x[row, bos:eos], weight, bias, h0[i], activation)
        ys.append(y)
        hts.append(ht)
    y = jnp.stack(ys) if offs is None else jnp.concatenate(ys)[None]
    return y, jnp.stack(hts)


_forward_jit = reference_jit(_forward, static_argnums=(4, 5))


def _gradients(primals, zero_h0, dy, dht, activation, offs):
    """The vjp of ``(y, ht)`` w.r.t. ``primals`` (x, weight; bias and h0 where given; a zero state where not)
    at ``(dy, dht)``."""
    def fn(p):
        return _forward(p["x"], p["weight"], p.get("bias"), p.get("h0", zero_h0), activation, offs)

    _, vjp = jax.vjp(fn, primals)
    return vjp((dy, dht))[0]


_gradients_jit = reference_jit(_gradients, static_argnums=(4, 5))


def _setup(x, weight, bias, initial_state, activation, cu_seqlens, compute_dtype):
    check_compute_dtype(compute_dtype)
    x, weight, bias, initial_state = as_arrays(x, weight, bias, initial_state)
    offs = offsets(cu_seqlens)
    _check(x, weight, bias, initial_state, activation, offs)
    return x, weight, bias, initial_state, offs


def causal_conv1d(x, weight, bias=None, initial_state=None, output_final_state=False, activation=None, *,
                  cu_seqlens=None, compute_dtype="float64"):
    """Returns ``(y [B,T,D], final_state [N,D,W-1])`` float64 numpy; final_state is None unless
    ``output_final_state``."""
    x, weight, bias, h0, offs = _setup(x, weight, bias, initial_state, activation, cu_seqlens, compute_dtype)
    cd = compute_dtype
    with float64_cpu(cd == "float64"):
        args = [to_jax(a, cd) for a in (x, weight, bias)]
        h0 = to_jax(h0, cd) if h0 is not None else jnp.zeros((num_states(x.shape[0], offs), x.shape[2],
                                                              weight.shape[1] - 1), cd)
        y, ht = _forward_jit(*args, h0, activation, offs)
        return to_numpy(y, cd), (to_numpy(ht, cd) if output_final_state else None)


def causal_conv1d_bwd(x, weight, bias, dy, dht=None, initial_state=None, activation=None, *, cu_seqlens=None,
                      compute_dtype="float64"):
    """Gradients of ``sum(y * dy) + sum(final_state * dht)`` w.r.t. the inputs given, float64 numpy:
    dict(dx, dweight, dbias, dh0); dbias is None without a bias, dh0 None without an initial state."""
    x, weight, bias, h0, offs = _setup(x, weight, bias, initial_state, activation, cu_seqlens, compute_dtype)
    cd = compute_dtype
    with float64_cpu(cd == "float64"):
        primals = {name: to_jax(a, cd) for name, a in (("x", x), ("weight", weight), ("bias", bias), ("h0", h0))
                   if a is not None}
        zero_h0 = jnp.zeros((num_states(x.shape[0], offs), x.shape[2], weight.shape[1] - 1), cd)
        cot_ht = zero_h0 if dht is None else to_jax(np.asarray(dht), cd)
        grads = _gradients_jit(primals, zero_h0, to_jax(np.asarray(dy), cd), cot_ht, activation, offs)
        return {"dx": to_numpy(grads["x"], cd), "dweight": to_numpy(grads["weight"], cd),
                "dbias": to_numpy(grads["bias"], cd) if "bias" in grads else None,
                "dh0": to_numpy(grads["h0"], cd) if "h0" in grads else None}
