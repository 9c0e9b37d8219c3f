"""User-like cases: a seeded sample of the shapes a kernel engineer adds, not the suites' own.

The suites were built (and the policy calibrated) on chosen shapes. A user's case file holds others: a
sequence of 80 tokens with a last chunk of 16, one head, K = V = 64, fp16, three packed sequences. The
false-alarm rate of the gate must hold there too, so it is measured on this sample (``--suite user-like``):

- every op (simple_gla's two variants, gla, kda, gdn), dtype (bf16, fp16, fp32) and gate kind it has;
- T from 1 to 300, so a partial last chunk is the rule, not the exception; a third of the cases pack two to
  four sequences;
- H from 1 to 4; K and V each in {64, 100, 128, 256} (padded to the lane width inside the kernels);
- h0 and dht on or off; the delta-rule ops' in-op options (q/k l2 norm, beta sigmoid, the in-kernel gate, for
  kda with fla's lower bound) on or off, and for them grouped value heads (HV = 2H) in one case of three;
- gla's chunk size is the one fla picks for the (packed) length, as a user following fla would write it.

Everything is drawn from one numpy generator seeded with :data:`SEED`: the sample is the same on every
machine and run, and its ids are ordinary case ids.
"""

from __future__ import annotations

import numpy as np

from .case import DTYPES, Case, Gate

SEED = 20261123
SIZE = 60
HEAD_DIMS = (64, 100, 128, 256)
MAX_T = 300
GROUPED_VALUE_OPS = ("kda", "gdn")


def _fla_gla_chunk(T: int) -> int:
    """fla's chunk_gla picks its chunk size from T itself: the next power of two, between 16 and 64."""
    return min(64, max(16, 1 << max(T - 1, 0).bit_length()))


def _lens(rng: np.random.Generator, T: int) -> tuple[int, ...] | None:
    """None (unpacked) for two cases in three; else two to four sequences of at least one token summing to T."""
    n = int(rng.integers(2, 5))
    if rng.random() < 2 / 3 or T < n:
        return None
    cuts = np.sort(rng.choice(np.arange(1, T), size=n - 1, replace=False))
    return tuple(int(x) for x in np.diff(np.concatenate([[0], cuts, [T]])))


def _op_and_gate(rng: np.random.Generator, H: int):
    """(op, variant, gate, options) of one case: each of the five op kinds one time in five."""
    g = Gate("g", "logsigmoid", normalizer=16)
    kind = int(rng.integers(5))
    if kind < 2:  # simple_gla: chunk or fused_chunk, a per-token or a per-head (ALiBi) gate
        variant = ("chunk", "fused_chunk")[kind]
        gamma = Gate("g_gamma", "alibi", num_layers=32, layer_idx=int(rng.integers(0, 32)))
        return "simple_gla", variant, (g if rng.random() < 0.5 else gamma), ()
    if kind == 2:
        gamma = Gate("g_gamma", "alibi", num_layers=32, layer_idx=int(rng.integers(0, 32)))
        return "gla", "chunk", (g if rng.random() < 0.5 else gamma), ()
    op = ("kda", "gdn")[kind - 3]
    options = {"use_qk_l2norm_in_kernel": bool(rng.random() < 0.5),
               "use_beta_sigmoid_in_kernel": bool(rng.random() < 0.5)}
    if rng.random() < 0.25:  # the gate computed in the op (kda: with fla's lower bound)
        options.update(use_gate_in_kernel=True, **({"lower_bound": -5.0} if op == "kda" else {}))
        gate = g
    else:  # kda's pre-computed gate is clamped as fla's chunk_kda expects; gdn's scalar decay is not
        gate = Gate("g", "logsigmoid", normalizer=16, lower_bound=-5.0) if op == "kda" else g
    return op, "chunk", gate, tuple((k, v) for k, v in options.items() if v is not False)


def user_like_cases(size: int = SIZE, seed: int = SEED) -> list[Case]:
    """``size`` user-like cases drawn with ``seed`` (see the module doc); distinct ids."""
    rng = np.random.default_rng(seed)
    out: dict[str, Case] = {}
    while len(out) < size:
        T = int(rng.integers(1, MAX_T + 1))
        H = int(rng.integers(1, 5))
        K, V = (int(rng.choice(HEAD_DIMS)) for _ in range(2))
        dtype = str(rng.choice(sorted(DTYPES)))
        op, variant, gate, options = _op_and_gate(rng, H)
        lens = _lens(rng, T)
        chunk = _fla_gla_chunk(T) if op == "gla" else 64
        h0, dht = bool(rng.random() < 0.5), bool(rng.random() < 0.5)
        HV = H * (2 if op in GROUPED_VALUE_OPS and rng.random() < 1 / 3 else 1)
        case = Case(op, variant, B=1 if lens else int(rng.integers(1, 3)), T=T, H=H, HV=HV, K=K, V=V, dtype=dtype,
                    gate=gate, chunk_size=chunk, h0=h0, dht=dht, lens=lens, options=options)
        out.setdefault(case.id, case)
    return list(out.values())
