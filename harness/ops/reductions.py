"""Compared tensors that are sums: what an op's descriptor declares of them, and the float64 magnitudes of
their terms (docs/definitions.md, "Bounds on reductions").

A gradient of a parameter broadcast over tokens, heads or channels (a shared ``g_gamma``, ``A_log``,
``dt_bias``) is a sum of one contribution per token (and head, channel): element i of the tensor is
``y_i = sum_j c_ij``. When the contributions cancel, ``|y_i|`` is far smaller than what was summed, and an error
that is small against the contributions is large against ``y_i``. The descriptor says which of its tensors are
such sums by declaring them :class:`ReductionSpec`\\ s (a :class:`~harness.ops.base.TensorSpec` with a
:class:`Reduction`); the reference cache asks the declared :attr:`Reduction.contributions` for the unreduced
terms in float64, from the case's inputs, and keeps their magnitudes ``a_i = sum_j |c_ij|``
(:func:`magnitudes`, which first checks that the terms sum to the reference's tensor). The bound of such a
tensor is then judged against ``a``, not ``y`` (:mod:`harness.core.policy`); the core names neither ops nor tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .base import TensorSpec

Contributions = Callable[[Any, Any, Mapping[str, np.ndarray], Mapping[str, np.ndarray]], np.ndarray]
"""``(op, case, x, golden) -> terms``: from the float64 inputs ``x`` (the state K-first, as a reference takes
them) and the reference's results ``golden``, the unreduced terms of the tensor as a float64 array whose
*trailing* axes are the tensor's shape and whose leading axes are summed (``terms.sum(leading axes)`` is the
tensor). ``op`` is the descriptor, for a contribution that needs its reference again."""

SUM_CHECK_RTOL = 1e-9
"""How closely the declared terms must sum to the reference's tensor, relative to the terms' magnitudes: float64
sums of a few thousand terms agree to ~1e-13; a wrong declaration is off by O(1)."""

MAGNITUDE_SUFFIX = "|terms|"


@dataclass(frozen=True)
class Reduction:
    """What a compared tensor sums: ``over`` says it in words (for rows and reports), ``contributions`` computes
    the terms (:data:`Contributions`)."""

    over: str
    contributions: Contributions


@dataclass(frozen=True)
class ReductionSpec(TensorSpec):
    """A compared tensor that is a sum of contributions (:class:`Reduction`)."""

    reduction: Reduction | None = None


def reduction_of(spec: TensorSpec) -> Reduction | None:
    """The spec's :class:`Reduction`, None for a tensor that is not declared a sum."""
    return getattr(spec, "reduction", None)


def magnitude_name(tensor: str) -> str:
    """The reference cache's name of a reduction's magnitudes ``a`` (``dg_gamma|terms|``)."""
    return tensor + MAGNITUDE_SUFFIX


def trailing(terms: np.ndarray, kept: Sequence[int]) -> np.ndarray:
    """``terms`` with the axes ``kept`` (those the tensor keeps, in its order) moved to the end: the layout
    :data:`Contributions` returns, the other axes summed."""
    terms = np.asarray(terms)
    kept = [a % terms.ndim for a in kept]
    summed = [a for a in range(terms.ndim) if a not in kept]
    return np.transpose(terms, summed + list(kept))


def magnitudes(terms: np.ndarray, y: np.ndarray, name: str = "tensor") -> np.ndarray:
    """``a = sum_j |c_j|`` per element of ``y`` (float64, ``y``'s shape) from ``terms`` (:data:`Contributions`'
    layout). ValueError when the terms' shape does not end in ``y``'s or they do not sum to ``y`` within
    :data:`SUM_CHECK_RTOL` of ``a``: a declaration that describes another sum is refused, never used."""
    terms = np.asarray(terms, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n = terms.ndim - y.ndim
    if n < 0 or terms.shape[n:] != y.shape:
        raise ValueError(f"the terms of {name} have shape {terms.shape}, which does not end in its shape {y.shape}")
    flat = terms.reshape((-1,) + y.shape)
    a = np.abs(flat).sum(axis=0)
    off = np.abs(flat.sum(axis=0) - y)
    if not np.all(off <= SUM_CHECK_RTOL * a + np.finfo(np.float64).tiny):
        worst = float(np.max(off / np.maximum(a, np.finfo(np.float64).tiny)))
        raise ValueError(f"the declared terms of {name} do not sum to the reference's {name}: off by {worst:.3g} "
                         f"of their magnitudes (allowed {SUM_CHECK_RTOL:g})")
    return np.array(a, dtype=np.float64).reshape(y.shape)
