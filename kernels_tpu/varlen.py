"""Packed variable-length sequences (fla's ``cu_seqlens``) for every op's kernels.

N sequences are packed along T of one batch row (B == 1): sequence i is the tokens ``[c_i, c_{i+1})``
of the offsets ``c = cu_seqlens`` (``0 = c_0 < ... < c_N = T``, checked by
:func:`op_contract.check_cu_seqlens`). As in fla and the float64 references
(:mod:`references._varlen`), the state resets at every sequence start (sequence i starts from
``initial_state[i]``, or zero, and ends in ``ht[i]``) and chunking restarts there, so no chunk
spans a boundary.

Design: the kernels walk chunks, not batch rows (:class:`ChunkWalk`). Outside the pallas_calls,
:meth:`ChunkWalk.to_rows` lays the packed sequences chunk-aligned in ONE kernel row: sequence i
takes ``ceil(len_i / C)`` consecutive chunks, its tokens first and identity tokens (q = k = v = 0,
log gate 0, kda's beta = 0: ``S -> S`` exactly) filling the rest of its last chunk (an empty
sequence takes one chunk of them, so its ht is its h0);
:meth:`ChunkWalk.to_tokens` gathers the outputs back to ``[1, T, ...]``. Two int32 tables,
scalar-prefetched into SMEM, tell every time-walking kernel which sequence each chunk belongs to
(so its index maps fetch that sequence's h0 or dht and write its ht or dh0) and where sequences
begin and end (so the carried f32 state restarts there: :class:`kernels_tpu.common.Walk`). A kernel
that computes the constant per-head gate (``g_gamma``) from token positions reads each chunk's
real tokens from a third table (:meth:`ChunkWalk.real_tokens`) and gives the filling tokens decay 1.
No chunk spans a boundary and every real token sees exactly what a separate B = 1 run of its
sequence would see: the packed outputs equal separate per-sequence runs bit for bit
(tests/kernels_tpu/test_head_dims_and_varlen.py). The two maps are single gathers with static
indices, so autodiff carries gradients back through them (a gather's transpose is a scatter-add;
filling positions get none). Gradients of shared parameters (g_gamma; kda's A_log, dt_bias) are
sums over the sequences, equal to the separate runs' sum up to summation order.

The work is ``sum_i ceil(len_i / C) * C`` tokens for ``T`` real ones (:meth:`ChunkWalk.work_ratio`).
Until 2026-11-24 the kernels ran one padded batch row per sequence instead, ``N * L_pad`` tokens
with ``L_pad`` the longest sequence rounded up to a chunk; measured, chunk size 64
(tests/kernels_tpu/test_head_dims_and_varlen.py::test_padding_overhead; footprints in
reports/varlen/README.md):

==================================================  ======  ===============  ===============
packing (lengths)                                   T       rows: N*L_pad/T  walk: sum/T
==================================================  ======  ===============  ===============
(37, 128, 91)                                       256     1.50             1.25
8 x 1024 (equal)                                    8192    1.00             1.00
(3000, 1500, 1200, 900, 700, 500, 300, 92)          8192    2.94             1.02
(8185, 1, 1, 1, 1, 1, 1, 1) (one long, 7 of 1)      8192    8.00             1.05
the stress suites' packing (2048, 1031, ..., 256)   8192    2.00             1.02
==================================================  ======  ===============  ===============
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Packing:
    """The sequences of the public token axis ``[B, T, ...]``: ``offsets`` None, not packed (B
    sequences of T tokens); otherwise fla's ``cu_seqlens`` as static Python ints (they fix the
    shapes), N = len(offsets) - 1 sequences in one batch row. Hashable, so it can be part of a
    kernel's static config; :class:`ChunkWalk` lays it out for the kernels.
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
        """Real tokens of each sequence: the packed lengths, or T for each of the B rows."""
        if not self.packed:
            return (self.T,) * self.batch
        return tuple(int(n) for n in np.diff(self.offsets))

    @property
    def N(self) -> int:
        """Sequences, one state each (h0, ht): the number packed, or B."""
        return len(self.lengths)

    def ends_inside_a_chunk(self, chunk_size: int) -> bool:
        """Some sequence ends inside a chunk (T, or a packed sequence's length, is not a multiple of the
        chunk size): that chunk mixes real and filling tokens."""
        return any(n % chunk_size for n in self.lengths)

    def _row_positions(self):
        """Static (sequence, position within it) of every packed token, in packing order."""
        row = np.repeat(np.arange(self.N), self.lengths)
        pos = np.arange(self.T) - np.asarray(self.offsets)[row]
        return row, pos


@dataclasses.dataclass(frozen=True)
class ChunkWalk:
    """The chunks a time-walking kernel visits, and the state each chunk belongs to: packed sequences
    without padding rows (every op's kernels).

    Not packed: B kernel rows of ``NT = ceil(T / C)`` chunks, row b all of state slot b. Packed: ONE kernel
    row in which sequence i takes ``ceil(len_i / C)`` consecutive chunks (one for an empty sequence)
    starting at chunk ``s_i`` (its tokens first, identity tokens filling the rest of its last chunk), so
    ``NT = sum_i ceil(len_i / C)``
    and the work is ``NT * C`` tokens for T real ones (:meth:`work_ratio`; 1.02 for the stress packing,
    where padding rows cost 2.0). Chunk c of a row is described by two int32 tables, scalar-prefetched
    into SMEM (:meth:`tables`): its state slot (the sequence: where its h0 comes from and its ht goes)
    and its edges (``FIRST``: the state starts here from h0 or zero; ``LAST``: the state leaves here as
    ht). A kernel walking the chunks in order resets its carried state at FIRST and emits at LAST (a
    reverse walk the other way round), so every real token sees exactly what a separate run of its own
    sequence sees: the outputs equal separate per-sequence runs bit for bit.
    """

    packing: Packing
    C: int  # tokens per chunk

    FIRST = 1  # edge bits
    LAST = 2

    @property
    def rows(self) -> int:
        """Kernel batch rows: 1 when packed, else B."""
        return 1 if self.packing.packed else self.packing.batch

    @property
    def chunks_per_sequence(self) -> tuple[int, ...]:
        """``ceil(len_i / C)``, and one chunk of identity tokens for an empty sequence: its state passes
        through unchanged, so its ht is its h0 (and its dh0 its dht), as fla's."""
        return tuple(max(1, -(-n // self.C)) for n in self.packing.lengths)

    @property
    def NT(self) -> int:
        """Chunks per kernel row."""
        per = self.chunks_per_sequence
        return sum(per) if self.packing.packed else per[0]

    @property
    def row_length(self) -> int:
        """Tokens per kernel row: ``NT * C``."""
        return self.NT * self.C

    def work_ratio(self) -> float:
        """Tokens the kernels process over real tokens: ``rows * NT * C / (B * T)``."""
        return self.rows * self.row_length / (self.packing.batch * self.packing.T)

    def _starts(self) -> np.ndarray:
        """First chunk of each sequence in the packed row."""
        return np.concatenate([[0], np.cumsum(self.chunks_per_sequence)[:-1]]).astype(np.int64)

    def _chunks(self):
        """Per chunk of the walk (index ``row * NT + chunk``): its sequence, and that sequence's first and
        last chunks."""
        per = np.asarray(self.chunks_per_sequence)
        if self.packing.packed:
            slot, starts = np.repeat(np.arange(len(per)), per), self._starts()
        else:  # row b is sequence b
            slot, starts = np.repeat(np.arange(self.rows), self.NT), np.arange(self.rows) * self.NT
        return slot, starts, starts + per - 1

    def tables(self):
        """``(slot, edge)``: int32 ``[rows * NT]`` (index ``row * NT + chunk``), for scalar prefetch: the
        chunk's sequence, and its FIRST / LAST bits."""
        slot, starts, ends = self._chunks()
        edge = np.zeros(slot.shape, np.int32)
        edge[starts] |= self.FIRST
        edge[ends] |= self.LAST
        return jnp.asarray(slot, jnp.int32), jnp.asarray(edge, jnp.int32)

    def real_tokens(self):
        """int32 ``[rows * NT]``: each chunk's real tokens (its first ones; the rest are identity tokens),
        for a gate the kernels compute from token positions (``g_gamma``)."""
        slot, starts, _ = self._chunks()
        within = np.arange(slot.size) - starts[slot]  # the chunk's index within its sequence
        real = np.clip(np.asarray(self.packing.lengths)[slot] - within * self.C, 0, self.C)
        return jnp.asarray(real, jnp.int32)

    # ------------------------------------------------------------ the two maps
    def _token_positions(self) -> np.ndarray:
        """Static position in the packed row of every packed token, in packing order."""
        row, pos = self.packing._row_positions()
        return self._starts()[row] * self.C + pos

    def to_rows(self, x):
        """``[B, T, ...]`` public tokens -> ``[rows, NT * C, ...]`` kernel rows (zeros: identity tokens)."""
        if x is None:
            return x
        if not self.packing.packed:
            pad = self.row_length - x.shape[1]
            return jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)) if pad else x
        src = np.full(self.row_length, self.packing.T)  # index T is past the end: zero-filled
        src[self._token_positions()] = np.arange(self.packing.T)
        return jnp.take(x[0], jnp.asarray(src, jnp.int32), axis=0, mode="fill", fill_value=0)[None]

    def to_tokens(self, y):
        """``[rows, NT * C, ...]`` kernel rows -> ``[B, T, ...]``: the real tokens only."""
        if y is None:
            return y
        if not self.packing.packed:
            return y[:, :self.packing.T]
        return y[0, jnp.asarray(self._token_positions(), jnp.int32)][None]
