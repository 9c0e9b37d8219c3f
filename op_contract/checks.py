"""The argument checks every op shares: q/k/v shapes and dtypes, packed sequence offsets
(``cu_seqlens``), the state and cotangents, scale, chunk_size and the sign of a log-decay gate.
Each raises ValueError with a one-line message that names the offending value and says what to
pass instead."""

from __future__ import annotations

import dataclasses
import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Dims:
    """The sizes of one call: batch, time, heads, key and value head dims, ``N`` the number of
    independent sequences, i.e. of states (B, or the number of packed sequences with ``cu_seqlens``),
    and ``HV`` the number of value heads (H, or a multiple of H with grouped value heads).

    A layout names its axes: a string of one-letter axes (``"BTHK"``) or a tuple of axis names
    (``("B", "T", "HV", "V")``); an axis ``"HV*K"`` is the product of its factors."""

    B: int
    T: int
    H: int
    K: int
    V: int
    N: int | None = None  # None: B (no packed sequences)
    HV: int | None = None  # None: H (no grouped value heads)

    def __post_init__(self):
        if self.N is None:
            object.__setattr__(self, "N", self.B)
        if self.HV is None:
            object.__setattr__(self, "HV", self.H)

    def shape(self, layout) -> tuple:
        """``layout`` as sizes, e.g. ``"BTHK"`` -> ``(B, T, H, K)``, ``("HV*K",)`` -> ``(HV * K,)``."""
        return tuple(math.prod(getattr(self, f) for f in axis.split("*")) for axis in layout)

    def name(self, layout) -> str:
        """``layout`` as messages write it, e.g. ``[B,T,HV,V]``. The value-head axis HV reads H when the call
        has no grouped value heads (HV == H), so the messages of an ungrouped call name one head count."""
        grouped = self.HV != self.H
        rename = lambda f: "H" if f == "HV" and not grouped else f  # noqa: E731
        return "[" + ",".join("*".join(map(rename, axis.split("*"))) for axis in layout) + "]"


# the layouts every op shares (value heads HV: H unless the op takes grouped value heads)
VALUES = ("B", "T", "HV", "V")
STATE = ("B", "HV", "K", "V")
PACKED_STATE = ("N", "HV", "K", "V")  # one state per packed sequence, named N in the messages


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


def expect(name: str, x, layout, dims: Dims, *, required: bool = False) -> None:
    """ValueError unless ``x`` is a floating array of shape ``layout`` (axes of :class:`Dims`).

    ``None`` passes unless ``required``."""
    if x is None and not required:
        return
    want = dims.shape(layout)
    if shape_of(x) != want:
        raise ValueError(f"{name} must be {dims.name(layout)} = {want}, got {described(x)}")
    check_floating(name, x)


def check_qkv(q, k, v, *, initial_state=None, do=None, dht=None, cu_seqlens=None,
              grouped_values: bool = False) -> Dims:
    """q, k [B,T,H,K] and v [B,T,HV,V] of one floating dtype, none empty; and, when given, the state
    and cotangents every op shares: initial_state and dht [N,HV,K,V], do [B,T,HV,V]. N is B, or with
    ``cu_seqlens`` (:func:`check_cu_seqlens`) the number of packed sequences: one state each.

    HV is H unless ``grouped_values`` (fla's grouped value attention, GVA, of kda and gdn): then v may
    have HV heads, a multiple of H (value head j reads q/k head j // (HV // H)); an HV that is not is
    a ValueError. Without ``grouped_values`` (simple_gla, gla) another head count of v is valid in
    fla but implemented nowhere here: NotImplementedError saying the fix."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if shape_of(x) is None or len(x.shape) != 4:
            raise ValueError(f"{name} must be a [B,T,H,*] array, got {described(x)}")
    B, T, H, K = q.shape
    dims = Dims(B, T, H, K, v.shape[-1], HV=v.shape[2])
    if tuple(k.shape) != dims.shape("BTHK") or tuple(v.shape[:2]) != (B, T):
        raise ValueError(f"need q, k [B,T,H,K] and v {dims.name(VALUES)}: got {q.shape=} {k.shape=} {v.shape=}")
    if min(B, T, H, dims.HV, dims.K, dims.V) < 1:
        raise ValueError(f"empty input: {q.shape=} {v.shape=}")
    if dims.HV != H and not grouped_values:
        raise NotImplementedError(f"grouped value heads are not supported: v has {dims.HV} heads, q and k {H}; "
                                  "repeat q and k to the value heads (repeat(q, HV // H, axis=2))")
    if dims.HV % H:
        raise ValueError(f"grouped value heads: v's HV={dims.HV} value heads must be a multiple of H={H}, the heads "
                         f"of q and k (value head j reads q/k head j // (HV // H)); give v a multiple of {H} heads")
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_floating(name, x)
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k, v must share one floating dtype: {q.dtype=} {k.dtype=} {v.dtype=}")
    state = STATE
    if cu_seqlens is not None:
        dims = dataclasses.replace(dims, N=check_cu_seqlens(cu_seqlens, dims))
        state = PACKED_STATE
    expect("initial_state", initial_state, state, dims)
    expect("do", do, VALUES, dims)
    expect("dht", dht, state, dims)
    return dims


def check_cu_seqlens(cu_seqlens, dims: Dims) -> int:
    """fla's packed variable-length sequences: ``cu_seqlens`` holds N+1 integer offsets
    ``0 = c_0 <= c_1 <= ... <= c_N = T`` into the one batch row (B == 1); sequence i is tokens
    ``[c_i, c_{i+1})``. A sequence may be empty (``c_i == c_{i+1}``, as fla's tests pack ``[0, 0, 16]``): its
    final state is its initial state. At least one token in all. Returns N.

    An array (numpy, jax) or a sequence of Python ints. Rank, length and dtype are always checked;
    the offsets themselves when their values are known (not a jax tracer, as for gates)."""
    x = cu_seqlens
    if isinstance(x, (list, tuple)):
        try:
            x = np.asarray(x)
        except ValueError:  # ragged nesting
            x = None
    if shape_of(x) is None or len(x.shape) != 1 or x.shape[0] < 2:
        raise ValueError(f"cu_seqlens must be a 1-D array of N+1 >= 2 integer offsets (0, len_0, len_0+len_1, "
                         f"..., T), got {described(cu_seqlens if x is None else x)}")
    if x.dtype == np.bool_ or not jnp.issubdtype(x.dtype, jnp.integer):
        raise ValueError(f"cu_seqlens must hold integer offsets, got cu_seqlens.dtype={x.dtype}; "
                         f"pass int32 or int64 offsets")
    if dims.B != 1:
        raise ValueError(f"cu_seqlens packs sequences along T of one batch row, so B must be 1, got B={dims.B}; "
                         f"flatten the batch into T ([1, B*T, ...]) and give every sequence's offsets")
    if isinstance(x, jax.core.Tracer) or not isinstance(x, (np.ndarray, jax.Array)):
        return x.shape[0] - 1  # offsets traced inside jit: their values cannot be checked here
    c = np.asarray(x).astype(np.int64)
    if c[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got cu_seqlens[0]={c[0]}")
    steps = np.diff(c)
    if (steps < 0).any():
        i = int(np.argmax(steps < 0))
        raise ValueError(f"cu_seqlens must be non-decreasing (a sequence has zero tokens or more), got "
                         f"cu_seqlens[{i}]={c[i]} > cu_seqlens[{i + 1}]={c[i + 1]}")
    if c[-1] != dims.T:
        raise ValueError(f"cu_seqlens must end at T={dims.T} (the packed length of q, k, v), got "
                         f"cu_seqlens[-1]={c[-1]}")
    return x.shape[0] - 1


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
