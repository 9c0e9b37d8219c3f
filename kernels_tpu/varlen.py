"""Packed variable-length sequences (fla's ``cu_seqlens``) for every op's kernels.

N sequences are packed along T of one batch row (B == 1): sequence i is the tokens ``[c_i, c_{i+1})``
of the offsets ``c = cu_seqlens`` (``0 = c_0 < ... < c_N = T``, checked by
:func:`op_contract.check_cu_seqlens`). As in fla and the float64 references
(:mod:`references._varlen`), the state resets at every sequence start (sequence i starts from
``initial_state[i]``, or zero, and ends in ``ht[i]``) and chunking restarts there, so no chunk
spans a boundary.

Design: outside the pallas_calls, :meth:`Packing.rows` scatters the packed tokens into N batch
rows, sequence i in row i, right-padded with identity tokens (q = k = v = 0, log gate 0, kda's
beta = 0: ``S -> S`` exactly), and the existing batched kernels run with B = N and one state per
row; :meth:`Packing.tokens` gathers the outputs back to ``[1, T, ...]``. The only kernel-side
change is for the constant per-head gate (``g_gamma``), which the kernels compute from token
positions rather than read per token: those kernels take each row's real length
(:attr:`Packing.lengths`, in SMEM) and give the tokens past it decay 1 (simple_gla), or skip the
whole chunks past it (gla's fused path).
Both are single gathers with static indices, so autodiff carries gradients back through them (a
gather's transpose is a scatter-add; padded positions get none) and the explicit backward
functions use the same two maps. A row's chunks start at its sequence's first token and its
identity tail leaves the state unchanged, so every real token sees exactly what a separate B = 1
run of its sequence would see: the packed outputs equal separate per-sequence runs bit for bit
(tests/kernels_tpu/test_head_dims_and_varlen.py). Gradients of shared parameters (g_gamma; kda's A_log,
dt_bias) are sums over the sequences, equal to the separate runs' sum up to summation order.

The price is padding: the kernels do ``N * L_pad`` tokens of work for ``T`` real ones, with
``L_pad`` the longest sequence rounded up to the chunk size (:meth:`Packing.work_ratio`). Measured
(tests/kernels_tpu/test_head_dims_and_varlen.py::test_padding_overhead), chunk size 64:

==================================================  ======  ============  =====================
packing (lengths)                                   T       N * L_pad     N * L_pad / T
==================================================  ======  ============  =====================
(37, 128, 91)                                       256     3 * 128       1.50
8 x 1024 (equal)                                    8192    8 * 1024      1.00
(3000, 1500, 1200, 900, 700, 500, 300, 92)          8192    8 * 3008      2.94
(8185, 1, 1, 1, 1, 1, 1, 1) (one long, 7 of 1)      8192    8 * 8192      8.00
==================================================  ======  ============  =====================

An in-kernel design (a scalar-prefetched table of per-sequence chunk offsets, chunks of one row)
would do ``sum_i ceil(len_i / C) * C`` tokens instead: 1.25, 1.00, 1.02 and 1.05 for the rows
above. The padding design is exact, needs no kernel change and costs little for sequences of
similar lengths; the skewed packings are where the in-kernel design would pay off.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Packing:
    """How the public token axis ``[B, T, ...]`` maps onto the kernels' batch rows ``[N, L, ...]``.

    ``offsets`` None: not packed, the batch as given (N = B rows of L = T tokens; :meth:`rows` and
    :meth:`tokens` are the identity). Otherwise fla's ``cu_seqlens`` as static Python ints (they fix
    the shapes): N = len(offsets) - 1 rows of ``L = max(lengths)`` tokens. Hashable, so it can be
    part of a kernel's static config.
    """

    batch: int
    T: int
    offsets: tuple[int, ...] | None = None

    @classmethod
    def of(cls, cu_seqlens, q) -> "Packing":
        """The packing of ``q [B, T, ...]`` by ``cu_seqlens`` (validated by the op contract first)."""
        B, T = int(q.shape[0]), int(q.shape[1])
        if cu_seqlens is None:
            return cls(B, T)
        if isinstance(cu_seqlens, jax.core.Tracer):
            raise NotImplementedError("cu_seqlens fixes the kernels' shapes, so its values must be static: pass a "
                                      "tuple of ints or a numpy array, not an array traced inside jit")
        return cls(B, T, tuple(int(c) for c in np.asarray(cu_seqlens)))

    @property
    def packed(self) -> bool:
        return self.offsets is not None

    @property
    def lengths(self) -> tuple[int, ...]:
        """Real tokens of each kernel row: the sequence lengths, or T for each of the B rows."""
        if not self.packed:
            return (self.T,) * self.batch
        return tuple(int(n) for n in np.diff(self.offsets))

    @property
    def N(self) -> int:
        """Kernel batch rows, one state each: the number of sequences, or B."""
        return len(self.lengths)

    @property
    def L(self) -> int:
        """Tokens per kernel row (before the kernels pad it to a chunk multiple)."""
        return max(self.lengths)

    def padded_length(self, chunk_size: int) -> int:
        """``L_pad``: tokens per kernel row once padded to a whole number of chunks."""
        return -(-self.L // chunk_size) * chunk_size

    def ends_inside_a_chunk(self, chunk_size: int) -> bool:
        """Some row's real tokens end inside a chunk (T, or a packed sequence's length, is not a multiple
        of the chunk size): that chunk mixes real and padding tokens."""
        return any(n % chunk_size for n in self.lengths)

    def work_ratio(self, chunk_size: int) -> float:
        """Tokens the kernels process over real tokens: ``N * L_pad / (B * T)``."""
        return self.N * self.padded_length(chunk_size) / (self.batch * self.T)

    # ------------------------------------------------------------ the two maps
    def _row_positions(self):
        """Static (row, position) of every packed token, in packing order."""
        row = np.repeat(np.arange(self.N), self.lengths)
        pos = np.arange(self.T) - np.asarray(self.offsets)[row]
        return row, pos

    def rows(self, x):
        """``[1, T, ...]`` packed tokens -> ``[N, L, ...]`` rows: sequence i in row i, then zeros
        (identity tokens, given inputs whose zero is the identity: see the module docstring)."""
        if x is None or not self.packed:
            return x
        start = np.asarray(self.offsets[:-1])[:, None]
        src = start + np.arange(self.L)[None, :]  # [N, L] token index of (row, position)
        src = np.where(np.arange(self.L)[None, :] < np.asarray(self.lengths)[:, None], src, self.T)
        # index T is past the end: filled with zeros (an identity token)
        return jnp.take(x[0], jnp.asarray(src, jnp.int32), axis=0, mode="fill", fill_value=0)

    def tokens(self, y):
        """``[N, L', ...]`` rows (L' >= L: padding beyond the sequences is dropped) -> ``[B, T, ...]``
        (B = 1 when packed): the real tokens only."""
        if y is None:
            return y
        if not self.packed:
            return y[:, :self.T]
        row, pos = self._row_positions()
        return y[jnp.asarray(row, jnp.int32), jnp.asarray(pos, jnp.int32)][None]
