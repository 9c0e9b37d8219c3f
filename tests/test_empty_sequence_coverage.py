"""The empty-sequence coverage rule, over the suites: every kernel path that smoke or regressions runs, under every
gate form it takes there, has a smoke or regressions case that packs an empty sequence (a length 0 in fla's
``cu_seqlens``) and compares that sequence's final state, which is its initial state passed through:

- **packed**: a case with a length 0 in ``lens``, ``h0`` (so ``dh0``), a final state (``ht``) and ``dht`` (so the
  state gradient reaches ``dh0`` through the empty sequence), where the path takes a ``dht`` (a forward-only path,
  e.g. a decode variant, takes none: there ``ht`` and ``h0``);
- **pooled** (``pool=S``, ``harness.ops.serving``), on every path that takes a pool (one that returns a final
  state: the pool is read as ``h0`` and written as ``ht``): a request of length 0 that has an initial state and
  reads it from a slot other than the one it writes (:func:`harness.ops.serving.slots`: an odd request), with the
  same ``h0`` and ``dht``. An empty request that reads the slot it writes cannot show a state written to the wrong
  slot, nor one that never moved.

A kernel path is the descriptor's ``kernel_path`` (gla's g_gamma cases take the fused kernels unless a packed
sequence is ragged and the final state is used), with ``+conv1d`` where the case puts the short convolution in
front (its own kernels); a gate form is each gate's kind with a ``g_gamma``'s shape, and ``in-op`` where the gate is
computed in the op (``use_gate_in_kernel``). Decode chains (``decode=n``) compare the forward only and do not
count. The rule reads the case features and the descriptors; it names no op.
"""

from __future__ import annotations

import cases.suites as suites
from harness.ops import get_op
from harness.ops.serving import inner, slots

SUITES = ("smoke", "regressions")


def kernel_path(case) -> str:
    path = get_op(case.op).kernel_path(case)
    return f"{path}+conv1d" if case.opt.get("conv1d") else path


def gate_form(case) -> str:
    form = "+".join(g.kind if g.kind == "g" else f"g_gamma[{g.gamma_shape}]" for g in case.gates) or "none"
    return f"{form} in-op" if case.opt.get("use_gate_in_kernel") else form


def key(case) -> tuple[str, str, str]:
    return case.op, kernel_path(case), gate_form(case)


def takes_dht(case) -> bool:
    """Whether the case's path takes a ``dht`` (its op's own validation of the case asked with one; serving options
    aside: a decode chain is forward only, the chunk path under it is not)."""
    try:
        get_op(case.op).validate(inner(case).replace(h0=True, final_state=True, dht=True))
    except ValueError:
        return False
    return True


def empty_state_compared(case) -> bool:
    """A packed case with an empty sequence whose final state is compared: ht with dht (where the path takes one),
    and h0."""
    return (case.lens is not None and 0 in case.lens and case.h0 and case.final_state
            and (case.dht or not takes_dht(case)))


def pooled_empty_request(case) -> bool:
    """:func:`empty_state_compared`, pooled, with an empty request that has an initial state and reads it from a
    slot other than its write slot."""
    s = slots(case)
    return s is not None and empty_state_compared(case) and any(
        n == 0 and init and r != w for n, r, w, init in zip(case.lens, s.read, s.write, s.has_initial_state))


def _cases() -> list:
    return [c for name in SUITES for c in suites.get_suite(name)]


def missing_empty_sequences(cases) -> list[tuple[str, str, str]]:
    """The (op, kernel path, gate form) keys the cases run that no case covers with a compared empty sequence."""
    keys = {key(c) for c in cases}
    return sorted(keys - {key(c) for c in cases if empty_state_compared(c)})


def missing_pooled_empty_requests(cases) -> list[tuple[str, str, str]]:
    """The keys that take a pool (some case of theirs returns a final state) and no pooled case covers with an
    empty request read from another slot."""
    keys = {key(c) for c in cases if c.final_state}
    return sorted(keys - {key(c) for c in cases if pooled_empty_request(c)})


def _listing(missing) -> str:
    return "\n".join(f"  {op}: path {path} x gate {form}" for op, path, form in missing)


def test_every_kernel_path_and_gate_form_compares_an_empty_sequences_state():
    missing = missing_empty_sequences(_cases())
    assert not missing, ("no smoke or regressions case packs an empty sequence (a length 0 in lens) with h0, ht and "
                         "dht (where the path takes one) on:\n" + _listing(missing))


def test_every_pooled_path_and_gate_form_serves_an_empty_request_from_another_slot():
    missing = missing_pooled_empty_requests(_cases())
    assert not missing, ("no smoke or regressions case pools (pool=S) an empty request with an initial state read "
                         "from another slot than it writes, with h0, ht and dht (where the path takes one), on:\n"
                         + _listing(missing))


def test_the_rules_read_features_on_hand_made_cases():
    from cases.case import Gate

    base = suites.Case("simple_gla", "chunk", B=1, T=16, H=1, K=64, V=64, gate=suites.G, chunk_size=16, h0=True,
                       dht=True, lens=(0, 0, 16))
    assert empty_state_compared(base) and not pooled_empty_request(base)
    assert not empty_state_compared(base.replace(dht=False))  # the path takes a dht: ht alone is not enough
    assert not empty_state_compared(base.replace(h0=False))
    assert not empty_state_compared(base.replace(lens=(8, 8), T=16))
    pooled = base.replace(options=(("pool", 7),))
    assert pooled_empty_request(pooled)  # request 1 is empty, reads slot 2, writes slot 3, has a state
    # requests 0 and 2 are empty: 0 reads the slot it writes, 2 has no initial state
    assert not pooled_empty_request(base.replace(lens=(0, 16, 0), options=(("pool", 7),)))
    decode = base.replace(dht=False, options=(("pool", 7), ("decode", 1)))
    assert not empty_state_compared(decode)  # a decode chain compares the forward only on a path that takes dht
    gamma = base.replace(gate=Gate("g_gamma", "const", value=-0.5, gamma_shape=""))
    assert key(gamma) == ("simple_gla", "chunk", "g_gamma[]")


def test_the_rules_fail_listing_each_new_case_s_path_when_it_is_dropped(monkeypatch):
    """Each of the cases added for the rules (:func:`cases.suites.empty_state_cases`) is needed: dropped from the
    regressions suite, a rule reports its path and gate form."""
    new = suites.empty_state_cases()
    assert new and all(c in _cases() for c in new)
    makers = suites.SUITES["regressions"]
    assert suites.empty_state_cases in makers
    for dropped in new:
        def without(dropped=dropped):
            return [c for c in suites.empty_state_cases() if c != dropped]

        monkeypatch.setitem(suites.SUITES, "regressions",
                            tuple(without if m is suites.empty_state_cases else m for m in makers))
        cases = _cases()
        assert dropped not in cases
        reported = set(missing_empty_sequences(cases)) | set(missing_pooled_empty_requests(cases))
        assert key(dropped) in reported, f"{dropped.id}: no rule reports {key(dropped)} when it is dropped"
        if pooled_empty_request(dropped):
            assert key(dropped) in missing_pooled_empty_requests(cases)
        line = _listing([key(dropped)])
        failures = []
        for rule in (test_every_kernel_path_and_gate_form_compares_an_empty_sequences_state,
                     test_every_pooled_path_and_gate_form_serves_an_empty_request_from_another_slot):
            try:
                rule()
            except AssertionError as e:
                failures.append(str(e))
        assert any(line in message for message in failures), f"{dropped.id}: no failing rule lists {line!r}"
