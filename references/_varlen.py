"""Packed variable-length sequences (fla's ``cu_seqlens``), shared by every reference.

N sequences are packed along T of one batch row (B == 1): sequence i is the tokens
``[c_i, c_{i+1})`` of the offsets ``c = cu_seqlens`` (``0 = c_0 < ... < c_N = T``, checked by
:func:`op_contract.check_cu_seqlens`). As in fla-core 0.6.0:

- the recurrent state resets at every sequence start: sequence i starts from ``initial_state[i]``
  (or zero) and never sees another sequence's tokens; its final state is ``ht[i]``;
- chunking restarts at every sequence start, so a chunk never spans a boundary (the last chunk of
  a sequence is short when its length is not a multiple of C).

The references get both by construction (:func:`over_sequences`): each sequence becomes its own
batch row, right-padded to a common length with identity tokens (q = k = v = 0, log decay 0, and
for kda beta = 0: ``S -> S`` exactly), and the op's batched core runs once on those rows from
``h0[i]``. A row's chunks start at its sequence's first token, and the identity tail leaves its
final state unchanged, so row i's final state is ``ht[i]`` (the cores already pad T to a multiple of
C the same way). Gradients (``jax.vjp`` through the slices, pads and concatenation) land on the
real tokens only, sum a shared parameter's contributions over the sequences (``g_gamma``, kda's
``A_log`` and ``dt_bias``) and give each sequence its own ``dh0[i]``. The price: N x max(len)
tokens of work instead of T, small for sequences of similar lengths; one compiled core whatever N.
"""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
import numpy as np


def offsets(cu_seqlens) -> tuple[int, ...] | None:
    """Validated offsets as a tuple of Python ints (static: they fix the slices), None when not packed."""
    return None if cu_seqlens is None else tuple(int(c) for c in np.asarray(cu_seqlens))


def num_states(batch: int, offs: tuple[int, ...] | None) -> int:
    """Leading dim of initial_state / ht / dht / dh0: the batch, or the number of packed sequences."""
    return batch if offs is None else len(offs) - 1


def over_sequences(core: Callable, offs: tuple[int, ...] | None, tokens: tuple, h0):
    """``core(*tokens, h0) -> (o, ht)`` on the batch as given when ``offs`` is None; otherwise once on the
    packed sequences as batch rows (see the module docstring), returning ``(o [1,T,H,V], ht [N,H,K,V])``.

    ``tokens`` are the core's per-token inputs [1,T,H,...] *after* any per-token preprocessing, each of
    which must make an identity token when zero; ``h0`` is [N,H,K,V] or None (the core's zero state)."""
    if offs is None:
        return core(*tokens, h0)
    spans = list(zip(offs[:-1], offs[1:]))
    L = max(eos - bos for bos, eos in spans)

    def rows(x):  # [1,T,...] -> [N,L,...]: sequence i in row i, identity (zero) tokens after its end
        tail = lambda n: [(0, L - n)] + [(0, 0)] * (x.ndim - 2)  # noqa: E731
        return jnp.stack([jnp.pad(x[0, bos:eos], tail(eos - bos)) for bos, eos in spans])

    o, ht = core(*(rows(x) for x in tokens), h0)
    return jnp.concatenate([o[i, :eos - bos] for i, (bos, eos) in enumerate(spans)])[None], ht
