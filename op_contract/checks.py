"""The argument checks every op shares: q/k/v shapes and dtypes, the state and cotangents, scale,
chunk_size and the sign of a log-decay gate. Each raises ValueError with a message that names
the offending value and says what to pass instead."""

from __future__ import annotations

import dataclasses
import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Dims:
    """The sizes of one call: batch, time, heads, key and value head dims."""

    B: int
    T: int
    H: int
    K: int
    V: int

    def shape(self, layout: str) -> tuple:
        """``layout`` as letters, e.g. ``"BTHK"`` -> ``(B, T, H, K)``."""
        return tuple(getattr(self, axis) for axis in layout)


def shape_of(x):
    """``x``'s shape as a tuple when it is an array (or a shape/dtype stand-in), else None."""
    return tuple(x.shape) if hasattr(x, "shape") and hasattr(x, "dtype") else None


def described(x):
    """The shape of an array, the type name of anything else: for messages."""
    return shape_of(x) if shape_of(x) is not None else type(x).__name__


def check_floating(name: str, x) -> None:
    """ValueError unless ``x`` has a floating dtype (bfloat16 included; int and bool are not)."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{name} must be floating point, got {name}.dtype={x.dtype}; cast it to a float dtype")


def expect(name: str, x, layout: str, dims: Dims, *, required: bool = False) -> None:
    """ValueError unless ``x`` is a floating array of shape ``layout`` (letters of :class:`Dims`).

    ``None`` passes unless ``required``."""
    if x is None and not required:
        return
    want = dims.shape(layout)
    if shape_of(x) != want:
        raise ValueError(f"{name} must be [{','.join(layout)}] = {want}, got {described(x)}")
    check_floating(name, x)


def check_qkv(q, k, v, *, initial_state=None, do=None, dht=None) -> Dims:
    """q, k [B,T,H,K] and v [B,T,H,V] of one floating dtype, none empty; and, when given, the state
    and cotangents every op shares: initial_state and dht [B,H,K,V], do [B,T,H,V].

    v with other heads than q and k (grouped value heads) is valid in fla but implemented by
    neither the references nor the kernels: NotImplementedError saying the fix."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if shape_of(x) is None or len(x.shape) != 4:
            raise ValueError(f"{name} must be a [B,T,H,*] array, got {described(x)}")
    B, T, H, K = q.shape
    dims = Dims(B, T, H, K, v.shape[-1])
    if tuple(k.shape) != dims.shape("BTHK") or tuple(v.shape[:2]) != (B, T):
        raise ValueError(f"need q, k [B,T,H,K] and v [B,T,H,V]: got {q.shape=} {k.shape=} {v.shape=}")
    if v.shape[2] != H:
        raise NotImplementedError(f"grouped value heads are not supported: v has {v.shape[2]} heads, q and k {H}; "
                                  "repeat q and k to the value heads (repeat(q, HV // H, axis=2))")
    if min(B, T, H, dims.K, dims.V) < 1:
        raise ValueError(f"empty input: {q.shape=} {v.shape=}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_floating(name, x)
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k, v must share one floating dtype: {q.dtype=} {k.dtype=} {v.dtype=}")
    expect("initial_state", initial_state, "BHKV", dims)
    expect("do", do, "BTHV", dims)
    expect("dht", dht, "BHKV", dims)
    return dims


def resolve_scale(scale, K: int) -> float:
    """``scale`` as a float: K**-0.5 when None, else a finite non-zero Python number (static)."""
    if scale is None:
        return float(K) ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale) or scale == 0:
        raise ValueError(f"scale must be None or a finite non-zero Python number, got {scale=}")
    return float(scale)


def positive_int(name: str, value) -> int:
    """``value`` unless it is not a positive Python int (bool is not an int here): ValueError."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive int")
    return value


def check_chunk_size(chunk_size) -> int:
    """Tokens per chunk: a positive int. (Which sizes an implementation runs is its own business.)"""
    return positive_int("chunk_size", chunk_size)


def concrete_max(x) -> float | None:
    """The largest value of ``x`` when its values are known: a numpy array or a concrete jax.Array.
    None for a jax tracer (inside jit, vjp, eval_shape), a shape/dtype stand-in, or an empty array."""
    if isinstance(x, jax.core.Tracer) or not isinstance(x, (np.ndarray, jax.Array)) or x.size == 0:
        return None
    return float(jnp.max(x)) if isinstance(x, jax.Array) else float(np.max(x))


def check_log_decay(name: str, x) -> None:
    """ValueError if the log-decay gate ``x`` has a positive value. Zero (decay 1) is allowed.

    Only concrete values are checked (:func:`concrete_max`): a gate traced inside jit/vjp is not."""
    largest = concrete_max(x)
    if largest is not None and largest > 0:
        raise ValueError(f"{name} is a log decay and must be <= 0 (a positive log-decay is not a decay: "
                         f"exp({name}) > 1 grows the state without bound), got max({name}) = {largest:.6g}; "
                         f"pass log decays, e.g. logsigmoid(x) or -softplus(x), or clip {name} to <= 0")
