"""The declared-path coverage rule (issue 67): every path an op's descriptor and this project's TPU binding accept
occurs in the smoke or regressions suite, or is listed in :data:`UNCOVERED` with a reason.

A path is (op, variant, gate form, packing, state option):

- gate form: ``g``, ``g_gamma[]``, ``g_gamma[H]``, ``g_gamma[H,K]`` or ``g`` with one of them (both at once); where
  an op computes its gate in the op (``use_gate_in_kernel``) the form is still ``g``;
- packing: ``dense`` (no ``lens``) or ``packed+empty`` (``lens`` with a length 0);
- state option: ``h0`` (an initial state, no pool) or ``pool`` (``pool=S``, ``harness.ops.serving``).

Accepted: the op's descriptor validates a probe case of the path and the TPU leg neither refuses it by its binding
(``supports``) nor by its kernels (:func:`harness.legs.tpu.kernel_refusal`, which asks the kernels themselves).
Covered: a smoke or regressions case with the same five features (a packed case counts for ``packed+empty`` only
with a length 0; decode chains, ``decode=n``, do not count: their steps run another variant). The rule reads the
descriptors, the binding and the cases; it names no op, so a path added to a descriptor or a kernel without a case
fails it, named.
"""

from __future__ import annotations

import functools
import itertools

import pytest

import cases.suites as suites
from cases.case import Case, Gate
from harness.ops import REGISTRY, get_op
from harness.ops.serving import split

SUITES = ("smoke", "regressions")
GAMMA_SHAPES = {"g_gamma[]": "", "g_gamma[H]": "H", "g_gamma[H,K]": "H,K"}
GATE_FORMS = ("g", *GAMMA_SHAPES, *(f"g+{form}" for form in GAMMA_SHAPES))
PACKINGS = ("dense", "packed+empty")
STATES = ("h0", "pool")

UNCOVERED: dict[tuple, str] = {
    (None, None, None, "dense", "pool"):
        "a pool is read and written per request by harness.ops.serving's gather and scatter, the same code on every "
        "op; each path's pooled case packs requests (packed+empty x pool), which adds the zero-length and the "
        "other-slot requests a dense batch cannot have",
    (None, None, None, "packed+empty", "h0"):
        "the pooled packed+empty case of the same path calls the kernels with exactly this: packed sequences with an "
        "empty one, each from an h0 (gathered from the pool, zeros for a request without a state), ht and dht",
    ("simple_gla", "chunk", "g_gamma[]", None, None):
        "the binding broadcasts g_gamma[] to [H] before the kernels (exact: gated.per_head_gamma), whose g_gamma[H] "
        "paths have cases; its own summed dg_gamma is covered by the pooled g_gamma[] case",
    ("simple_gla", "fused_chunk", "g_gamma[]", None, None):
        "as simple_gla.chunk: broadcast to [H] before the kernels (exact), whose g_gamma[H] paths have cases",
    ("gla", "chunk", "g_gamma[]", None, None):
        "the binding broadcasts g_gamma[] to [H] before the kernels (exact), whose g_gamma[H] paths have cases",
}
"""Accepted paths with no case, each with the reason it has none: a key is a path with None for "any"."""


def listed(p, table) -> bool:
    return any(all(k is None or k == x for k, x in zip(key, p)) for key in table)


def gate_form(case: Case) -> str:
    return "+".join(g.kind if g.kind == "g" else f"g_gamma[{g.gamma_shape}]" for g in case.gates) or "none"


def packing(case: Case) -> str:
    if case.lens is None:
        return "dense"
    return "packed+empty" if 0 in case.lens else "packed"


def state(case: Case) -> str:
    if "pool" in case.opt:
        return "pool"
    return "h0" if case.h0 else "none"


def path(case: Case) -> tuple[str, str, str, str, str]:
    return case.op, case.variant, gate_form(case), packing(case), state(case)


def covered(cases) -> set:
    return {path(c) for c in cases if "decode" not in c.opt}


def _gates(form: str) -> dict:
    gamma = lambda shape: Gate("g_gamma", "const", value=-0.5, gamma_shape=shape)
    if form == "g":
        return dict(gate=suites.G)
    if form.startswith("g+"):
        return dict(gate=suites.G, gamma=gamma(GAMMA_SHAPES[form[2:]]))
    return dict(gate=gamma(GAMMA_SHAPES[form]))


def probe(op: str, variant: str, form: str, pack: str, st: str) -> Case | None:
    """A small case of the path, or None where the descriptor does not take it (ValueError on construction or
    validation). Ops with grouped value heads get HV = 2H, as the suites run them."""
    shape = dict(B=1, T=16, H=1, K=128, V=128, dtype="bfloat16", chunk_size=16, h0=True, dht=True)
    if pack == "packed+empty":
        shape.update(lens=suites.EMPTY_LENS, T=sum(suites.EMPTY_LENS))
    options = (("pool", 7),) if st == "pool" else ()
    try:
        case = Case(op, variant, options=options, **_gates(form), **shape)
        get_op(op).validate(case)
    except ValueError:
        return None
    return case


@functools.lru_cache(maxsize=None)
def accepted(op: str, variant: str, form: str, pack: str, st: str) -> bool:
    from harness.legs.tpu import kernel_refusal

    case = probe(op, variant, form, pack, st)
    if case is None:
        return False
    desc = get_op(op)
    if desc.pallas is None or desc.pallas.supports(case) is not None:
        return False
    return kernel_refusal(desc, case) is None


def declared_paths(ops=None) -> list[tuple[str, str, str, str, str]]:
    out = []
    for op in ops or sorted(REGISTRY):
        for variant, form, pack, st in itertools.product(get_op(op).variants, GATE_FORMS, PACKINGS, STATES):
            if accepted(op, variant, form, pack, st):
                out.append((op, variant, form, pack, st))
    return out


def missing(paths, cases, table=UNCOVERED) -> list[tuple]:
    have = covered(cases)
    return [p for p in paths if p not in have and not listed(p, table)]


def _suite_cases() -> list[Case]:
    return [c for name in SUITES for c in suites.get_suite(name)]


def _listing(paths) -> str:
    return "\n".join("  " + " x ".join(p) for p in paths)


def test_every_declared_path_has_a_case_or_a_reason():
    gaps = missing(declared_paths(), _suite_cases())
    assert not gaps, ("paths the descriptors and the TPU binding accept with no smoke or regressions case and no "
                      "reason in UNCOVERED (op x variant x gate form x packing x state):\n" + _listing(gaps))


def test_every_listed_reason_is_still_needed():
    """A path listed in UNCOVERED that a case now covers, or that nothing accepts any more, leaves the table."""
    gaps = missing(declared_paths(), _suite_cases(), {})
    stale = [key for key in UNCOVERED if not any(listed(p, {key: ""}) for p in gaps)]
    assert not stale, "UNCOVERED lists paths that need no reason (covered, or accepted by nothing):\n" + "\n".join(
        f"  {key}" for key in stale)


@pytest.mark.parametrize("op", ["simple_gla", "gla"])
def test_the_rule_names_a_path_whose_case_is_removed(op):
    """From the test side: drop the suites' cases of one declared path (the decode variant with both gates, packed
    with an empty sequence, pooled) from a copy of the case list, and the rule names exactly that path."""
    form = "g+g_gamma[H]" if op == "simple_gla" else "g+g_gamma[H,K]"
    target = (op, "fused_recurrent", form, "packed+empty", "pool")
    paths = declared_paths([op])
    assert target in paths
    cases = _suite_cases()
    assert not missing(paths, cases)
    fewer = [c for c in cases if path(c) != target]
    assert len(fewer) < len(cases)
    assert missing(paths, fewer) == [target]
    # and a reason in the table silences it
    assert missing(paths, fewer, {**UNCOVERED, target: "a reason"}) == []
