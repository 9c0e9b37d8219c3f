"""Deterministic input generation: the same case gives the same bits everywhere.

Each op descriptor declares its inputs as ``InputSpec``s (name, shape, dtype,
law). ``make_inputs`` draws them in declared order from one numpy ``Generator``
(PCG64) seeded with ``case.rng_seed`` (a sha256 of the case id), quantizes
each array bit-exactly to its dtype (ml_dtypes for bfloat16, round to nearest
even), and hashes the result. Every leg receives exactly these arrays.

An op's state-shaped inputs (``h0``, ``dht``) take ``case.state_shape`` = [N,H,K,V], one state per
sequence: N = B, or the number of packed sequences of a case with ``lens`` (fla's ``cu_seqlens``,
``case.cu_seqlens``). A packed case draws like any other: its id, hence its seed, names the lengths.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Mapping

import ml_dtypes
import numpy as np

from .case import Case

NP_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float64": np.dtype(np.float64),
}

Law = Callable[[Case, np.random.Generator, tuple[int, ...]], np.ndarray]
"""A law draws a float64 array of the given shape for a case."""


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: Callable[[Case], tuple[int, ...]]
    dtype: str  # "case" (the case dtype) or a fixed dtype name such as "float32"
    law: Law
    doc: str = ""

    def resolve_dtype(self, case: Case) -> str:
        return case.dtype if self.dtype == "case" else self.dtype


# ---------------------------------------------------------------------- laws
def normal(std: float = 1.0) -> Law:
    def law(case, rng, shape):
        return rng.standard_normal(shape) * std

    law.__doc__ = f"N(0, {std}^2)"
    return law


def sigmoid_normal(case, rng, shape):
    """sigmoid(N(0,1)), e.g. the delta-rule beta."""
    return 1.0 / (1.0 + np.exp(-rng.standard_normal(shape)))


def l2normed_normal(case, rng, shape):
    """N(0,1) rows normalised to unit L2 norm over the last axis."""
    x = rng.standard_normal(shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def logsigmoid(x: np.ndarray) -> np.ndarray:
    """Numerically stable log(sigmoid(x)) in float64."""
    return np.minimum(x, 0.0) - np.log1p(np.exp(-np.abs(x)))


def alibi_slopes(num_heads: int) -> np.ndarray:
    """ALiBi slopes, float64 [H]: ``2**(-8 (h+1) / H)`` for a power-of-two H,
    and the interleaved extension of the ALiBi paper otherwise."""
    def power_of_two(n):
        return 2.0 ** (-8.0 * np.arange(1, n + 1) / n)  # exact powers of two where 8(h+1)/n is an integer

    if num_heads & (num_heads - 1) == 0:
        return power_of_two(num_heads)
    closest = 2 ** int(np.floor(np.log2(num_heads)))
    extra = power_of_two(2 * closest)[0::2][: num_heads - closest]
    return np.concatenate([power_of_two(closest), extra])


def alibi_g_gamma(num_heads: int, num_layers: int, layer_idx: int) -> np.ndarray:
    """Per-head log decay [H] used by production models:
    ``-slope * (1 - layer_idx / max(num_layers - 1, 1) + 1e-5)``."""
    return -alibi_slopes(num_heads) * (1.0 - layer_idx / max(num_layers - 1, 1) + 1e-5)


def g_gamma_shape(gate, case: Case) -> tuple[int, ...]:
    """A ``g_gamma`` gate's input shape: () for one value for every head, (H,) per head (the default), (H, K) per
    head and key channel (:attr:`cases.case.Gate.gamma_shape`)."""
    return {"": (), "H": (case.H,), "H,K": (case.H, case.K)}[gate.gamma_shape]


def draw_gate(gate, case: Case, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """One gate's log decays, float64, of ``shape``: a ``g`` gate's per-token shape [B,T,H,...] or a ``g_gamma``'s
    (:func:`g_gamma_shape`). By law: ``logsigmoid(N(0,1)) / normalizer``; ALiBi's per-head ``g_gamma`` broadcast
    over the other axes; ``value`` everywhere (``const``, no draw); ``-|N(0,1)| / normalizer`` (``halfnormal``).
    Then the optional ``lower_bound`` clamp, and fla's tests' masking: each log decay zeroed with probability
    ``mask_p`` (drawn after the gate, so ``mask_p = 0`` draws as before)."""
    if gate.law == "alibi":
        gamma = alibi_g_gamma(case.H, gate.num_layers, gate.layer_idx)
        h_axis = 2 if gate.kind == "g" else 0  # per-token [B,T,H,...]; a g_gamma [H] or [H,K]
        index = tuple(slice(None) if axis == h_axis else None for axis in range(len(shape)))
        g = np.array(np.broadcast_to(gamma[index], shape), dtype=np.float64)
    elif gate.law == "const":
        g = np.full(shape, float(gate.value))
    elif gate.law == "halfnormal":
        g = -np.abs(rng.standard_normal(shape)) / gate.normalizer
    else:
        g = logsigmoid(rng.standard_normal(shape)) / gate.normalizer
    if gate.lower_bound is not None:
        g = np.maximum(g, gate.lower_bound)
    if gate.mask_p:
        g = g * (rng.random(shape) > gate.mask_p)
    return g


def gate_law(case, rng, shape):
    """The case's gate (``case.gate``), drawn by :func:`draw_gate`."""
    return draw_gate(case.gate, case, rng, shape)


def gamma_law(case, rng, shape):
    """The g_gamma gate of a case with both gates (``case.gamma``), drawn by :func:`draw_gate` after the g gate."""
    return draw_gate(case.gamma, case, rng, shape)


# ------------------------------------------------------------------- drawing
def quantize(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round a float64 array to ``dtype`` (round to nearest even), C-contiguous, of ``x``'s shape (a 0-d array
    stays 0-d: ``np.ascontiguousarray`` would make it 1-d)."""
    return np.asarray(x, dtype=np.float64).astype(NP_DTYPES[dtype], order="C")


def inputs_sha256(arrays: Mapping[str, np.ndarray]) -> str:
    """sha256 over (name, dtype, shape, bytes) of every array, in name order."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.asarray(arrays[name])
        h.update(f"{name}:{a.dtype.name}:{a.shape};".encode())
        h.update(a.tobytes(order="C"))
    return h.hexdigest()


@dataclass(frozen=True)
class Inputs:
    """The quantized arrays of one case and the sha256 of their bytes."""

    arrays: dict[str, np.ndarray]
    sha256: str

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def get(self, name: str):
        return self.arrays.get(name)

    def as_float64(self) -> dict[str, np.ndarray]:
        """The same values upcast to float64 (exact: every case dtype embeds in float64)."""
        return {k: v.astype(np.float64) for k, v in self.arrays.items()}


def input_shapes(case: Case, specs: list[InputSpec]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Each input's (shape, numpy dtype), without drawing anything."""
    return {spec.name: (tuple(int(s) for s in spec.shape(case)), np.dtype(NP_DTYPES[spec.resolve_dtype(case)]))
            for spec in specs}


def make_inputs(case: Case, specs: list[InputSpec]) -> Inputs:
    rng = np.random.Generator(np.random.PCG64(case.rng_seed))
    arrays = {}
    for spec in specs:
        shape = tuple(int(s) for s in spec.shape(case))
        arrays[spec.name] = quantize(spec.law(case, rng, shape), spec.resolve_dtype(case))
    for name, a in arrays.items():
        if not np.all(np.isfinite(a.astype(np.float64))):
            raise ValueError(f"input {name!r} of {case.id} is not finite after quantization to {a.dtype}")
    return Inputs(arrays, inputs_sha256(arrays))
