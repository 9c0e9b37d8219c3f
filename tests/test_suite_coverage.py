"""The packing-edge coverage rule, over the suites: every op, variant, gate kind and kernel path that smoke or
regressions runs has smoke or regressions cases that pack each edge of a chunk (fla's ``cu_seqlens``):

- a one-token sequence;
- sequences of C - 1, C and C + 1 tokens;
- a sequence whose length is an exact multiple of C, next to a longer one.

The kernel path is the descriptor's (``OpDescriptor.kernel_path``): gla's g_gamma cases run single-call fused
kernels, unless a packed sequence is ragged and the final state is asked for, which takes the chunk kernels, so
the fused path's edges need cases without ``ht``.
"""

from __future__ import annotations

import pytest

from cases.suites import get_suite
from harness.ops import get_op

SUITES = ("smoke", "regressions")


def _key(case) -> tuple:
    return case.op, case.variant, case.gate.kind if case.gate else None, get_op(case.op).kernel_path(case)


def packing_edges(lens: tuple[int, ...], C: int) -> set[str]:
    """The chunk edges one packing holds (the names of the module docstring's list)."""
    edges = set()
    if 1 in lens:
        edges.add("one token")
    for name, n in (("C - 1", C - 1), ("C", C), ("C + 1", C + 1)):
        if n in lens:
            edges.add(name)
    if any(n % C == 0 and max(lens[max(i - 1, 0):i + 2]) > n for i, n in enumerate(lens)):
        edges.add("multiple of C next to a longer one")
    return edges


EDGES = {"one token", "C - 1", "C", "C + 1", "multiple of C next to a longer one"}


def test_packing_edges_on_hand_made_packings():
    assert packing_edges((1, 63, 64, 65), 64) == EDGES
    assert packing_edges((1, 63, 65), 64) == EDGES - {"C", "multiple of C next to a longer one"}
    assert packing_edges((64, 65), 64) == {"C", "C + 1", "multiple of C next to a longer one"}
    assert packing_edges((128, 64), 64) == {"C", "multiple of C next to a longer one"}  # 64 next to 128
    assert packing_edges((64, 37), 64) == {"C"}  # a multiple of C, but next to a shorter one
    assert packing_edges((37, 70, 21), 64) == set()


def _coverage() -> dict[tuple, set[str]]:
    cases = [c for s in SUITES for c in get_suite(s)]
    covered: dict[tuple, set[str]] = {_key(c): set() for c in cases}
    for c in cases:
        if c.lens is not None:
            covered[_key(c)] |= packing_edges(c.lens, c.chunk_size)
    return covered


@pytest.mark.parametrize("key", sorted(_coverage(), key=str), ids=lambda k: "/".join(map(str, k)))
def test_every_kernel_path_packs_every_chunk_edge(key):
    missing = EDGES - _coverage()[key]
    assert not missing, f"{key}: no smoke or regressions case packs {sorted(missing)}"
