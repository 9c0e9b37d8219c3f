"""How much of ε_TPU/ε_GPU is sampling noise: a paired block bootstrap of the rel_l2 ratio.

The rule and its assumptions are derived in docs/definitions.md ("The decision rule"). In short: both legs
ran on the same inputs against the same float64 reference, so their per-element errors can be
paired. Each row carries ``rel_l2_blocks`` (:func:`harness.core.metrics.rel_l2_blocks`): the squared
relative error of M contiguous blocks of the tensor, summing to rel_l2². Resampling the M blocks
with replacement, the same indices for both legs, gives bootstrap replicates of

    R = ε_TPU / ε_GPU = sqrt(Σ_b t_b / Σ_b g_b)

and the gate reads the one-sided lower confidence bound at level 1 − α as "how small the ratio can
plausibly be". The resampling indices are a fixed function of M (seeded), so a verdict is
reproducible bit for bit.
"""

from __future__ import annotations

import functools
import math

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

    A replicate whose GPU sum is 0 is ``inf`` (or 1 when the TPU's is 0 too), as :func:`harness.judge.gate` rates
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


# ------------------------------------------------------------ between draws: the sequential test
BOOTSTRAP_MIN_ELEMENTS = 1024
"""A tensor the block bootstrap may decide a failure on from one draw: at least 32 elements in each of its 32
blocks. On fewer the blocks are too few elements to stand for one another, and their errors are correlated
(a reverse cumulative sum over time): an 80-element dg (2 or 3 per block) had bootstrap bounds of 1.22 and
1.24 on clean kernels whose 8-draw geometric-mean ratio is 1.07. Such a failure goes to the draws."""

LOOKS = (1, 3, 8, 24)
"""The numbers of input draws at which a comparison is decided: one draw first; where its verdict is not a
pass, 3, 8, then 24, the cap. An input draw redraws every input (the case's seed), so the between-draw spread
of the ratio is its whole noise: what the block bootstrap of one draw only estimates, and underestimates
for a small tensor whose elements are correlated (a reverse cumulative sum over time, such as dg). The look
at 24 is measured: on clean kernels, simple_gla's T80 K=V=64 bf16 case had dg ratios whose first 8 draws
gave a geometric mean of 1.22 (lower bound 0.86: undecided), and whose 24 draws gave 0.99 (a pass); draws
8-31, which nothing was tuned on, 0.90 (reports/calibration/draws-t80-k64)."""


def next_look(draws: int) -> int | None:
    """The number of draws the sequential test decides at next, after ``draws``; None at the cap."""
    return next((n for n in LOOKS if n > draws), None)


def pooled_looks(draws: int) -> list[int]:
    """The pooled looks the sequential test takes over ``draws`` input draws, in order: each look of
    :data:`LOOKS` past the first that the draws reach, then every draw there is when that is not a look itself
    (``parity calibrate --draws 5``: 3, then 5). Draws past the cap are not used, so there are never more
    pooled looks than the α of :func:`pooled_decision` is spread over."""
    n = min(draws, LOOKS[-1])
    return [look for look in LOOKS[1:] if look < n] + ([n] if n >= 2 else [])


def sequential_decision(ratios, limit: float, alpha: float) -> tuple[str, int, float, float]:
    """``(decision, draws used, geometric mean, lower bound)`` of a comparison whose first draw did not decide
    it, over its draws' ratios in draw order: :func:`pooled_decision` at each of :func:`pooled_looks`, on the
    first ``look`` draws, stopping at the first look that decides. The verdict is therefore the one the
    sequence of looks would have reached had the draws been run one look at a time: draws beyond the deciding
    look neither fail nor pass it. One draw alone is ``undecided``."""
    r = list(ratios)
    decision, used, mean, lower = "undecided", 1, math.nan, math.nan
    for look in pooled_looks(len(r)):
        decision, mean, lower = pooled_decision(r[:look], limit, alpha)
        used = look
        if decision != "undecided":
            break
    return decision, used, mean, lower


def pooled_decision(ratios, limit: float, alpha: float) -> tuple[str, float, float]:
    """``(decision, geometric mean, lower bound)`` of the ratio ε_TPU/ε_GPU over D ≥ 2 input draws.

    The draws' log ratios x_d = ln R_d are taken as independent normal draws (each draw redraws every
    input; a ratio of two errors is close to log-normal). With their mean x̄ and sample standard deviation
    s, the one-sided (1 − α') lower confidence bound of the mean log ratio is L = x̄ − t(1 − α', D − 1)·s/√D,
    where α' = α / (len(LOOKS) − 1) spreads α over the pooled looks (Bonferroni), so a kernel whose true
    geometric-mean ratio is within ``limit`` fails with probability at most α over the whole sequence.

    - ``fail``: exp(L) > limit, the ratio exceeds the limit beyond the draws' noise;
    - ``pass``: exp(x̄) ≤ limit, the point rule on the pooled ratio (as one draw's point rule);
    - ``undecided``: neither, so more draws are needed (``inconclusive`` at the cap).

    A ratio of 0 (the TPU exact) or ∞ (the GPU exact, the TPU not) is clipped to 1e-300 / 1e300 first.
    """
    from scipy import stats

    r = np.clip(np.asarray(ratios, dtype=np.float64), 1e-300, 1e300)
    if r.ndim != 1 or r.size < 2 or not np.isfinite(r).all():
        raise ValueError(f"the pooled test needs two or more finite ratios, got {ratios!r}")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha}")
    x = np.log(r)
    mean, sd = float(x.mean()), float(x.std(ddof=1))
    q = float(stats.t.ppf(1 - alpha / (len(LOOKS) - 1), r.size - 1))
    lower = mean - q * sd / math.sqrt(r.size)
    log_limit = math.log(limit)
    decision = "fail" if lower > log_limit else "pass" if mean <= log_limit else "undecided"
    return decision, math.exp(mean), math.exp(lower)
