"""How much of ε_TPU/ε_GPU is sampling noise: a paired block bootstrap of the rel_l2 ratio.

The rule and its assumptions are derived in docs/definitions.md ("The decision rule"). In short: both legs
ran on the same inputs against the same float64 reference, so their per-element errors can be
paired. Each row carries ``rel_l2_blocks`` (:func:`harness.metrics.rel_l2_blocks`): the squared
relative error of M contiguous blocks of the tensor, summing to rel_l2². Resampling the M blocks
with replacement, the same indices for both legs, gives bootstrap replicates of

    R = ε_TPU / ε_GPU = sqrt(Σ_b t_b / Σ_b g_b)

and the gate reads the one-sided lower confidence bound at level 1 − α as "how small the ratio can
plausibly be". The resampling indices are a fixed function of M (seeded), so a verdict is
reproducible bit for bit.
"""

from __future__ import annotations

import functools

import numpy as np

RESAMPLES = 4000
"""Bootstrap replicates per comparison: the α = 0.01 quantile is then the 40th smallest of 4000."""

SEED = 20261122
"""Seed of the resampling indices (with the block count); fixed so that verdicts are reproducible."""


@functools.lru_cache(maxsize=64)
def resample_indices(m: int) -> np.ndarray:
    """[RESAMPLES, m] block indices drawn with replacement; the first row is the identity (the data itself)."""
    idx = np.random.default_rng([SEED, m]).integers(0, m, size=(RESAMPLES, m))
    idx[0] = np.arange(m)
    idx.setflags(write=False)
    return idx


def ratio_replicates(gpu_blocks: np.ndarray, tpu_blocks: np.ndarray) -> np.ndarray:
    """Bootstrap replicates of sqrt(Σ tpu / Σ gpu) over the blocks, resampled in pairs.

    A replicate whose GPU sum is 0 is ``inf`` (or 1 when the TPU's is 0 too), as :func:`harness.gate` rates
    an exact baseline."""
    g = np.asarray(gpu_blocks, dtype=np.float64)
    t = np.asarray(tpu_blocks, dtype=np.float64)
    if g.shape != t.shape or g.ndim != 1 or g.size == 0:
        raise ValueError(f"paired blocks must be two equal, non-empty 1-D arrays; got {g.shape} and {t.shape}")
    idx = resample_indices(g.size)
    gs, ts = g[idx].sum(axis=1), t[idx].sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.sqrt(ts / gs)
    return np.where(gs == 0, np.where(ts == 0, 1.0, np.inf), ratio)


def ratio_lower_bound(gpu_blocks: np.ndarray, tpu_blocks: np.ndarray, alpha: float) -> float:
    """The one-sided (1 − alpha) lower confidence bound of ε_TPU/ε_GPU: the alpha quantile of the
    replicates (``method="lower"``: always a replicate's value, never interpolated)."""
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha}")
    return float(np.quantile(ratio_replicates(gpu_blocks, tpu_blocks), alpha, method="lower"))
