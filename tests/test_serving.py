"""Serving case features (``harness.ops.serving``): the slot and chain rules on hand-written values, the float64
reference against independent computations (each request on its own; a prefill then token-by-token recurrent
steps) to 1e-12, the pool's chain rule against autodiff in jax and torch, and the legs' pools bit for bit."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cases.case import Case, Gate
from cases.inputs import make_inputs
from cases.suites import serving_cases
from harness.ops import REGISTRY
from harness.ops.base import LegBinding, per_token
from harness.ops.gdn import GDN
from harness.ops.gla import GLA
from harness.ops.kda import KDA
from harness.ops.serving import (Slots, chain, gather, inner, pool_gradient, run_chain, scatter, served_binding,
                                 served_forward, slots, split, write_back)
from harness.ops.simple_gla import SIMPLE_GLA

RAW = {d.name: d for d in (SIMPLE_GLA, GLA, KDA, GDN)}  # the descriptors as the ops wrote them, unserved
G = Gate("g", "logsigmoid", normalizer=16)


def _case(lens=(2, 0, 5, 3), **options) -> Case:
    return Case("gdn", "chunk", B=1, T=sum(lens), H=1, K=16, V=16, dtype="float32", gate=G, h0=True, lens=lens,
                options=tuple(options.items()))


# ----------------------------------------------------------------- the rules, by hand
def test_slots_rule_by_hand():
    s = slots(_case(pool=9))
    assert s == Slots(size=9, read=(1, 2, 5, 6), write=(1, 3, 5, 7), has_initial_state=(True, True, False, True))
    assert s.kept == (0, 2, 4, 6, 8)  # read-only slots (2, 6) come back too
    assert slots(_case()) is None
    base, serving = split(_case(pool=9, decode=2))
    assert serving == {"pool": 9, "decode": 2} and base.options == () and base.h0


def test_chain_by_hand():
    """lens 2, 0, 5, 3 with three decode steps: request 0 (2 tokens) decodes both and joins at step 1, request 1
    has none, the others prefill 2 and 0 tokens first."""
    calls = chain(GDN, _case(decode=3))
    assert [(c.case.variant, c.case.lens, c.positions) for c in calls] == [
        ("chunk", (0, 0, 2, 0), (2, 3)),
        ("fused_recurrent", (0, 0, 1, 1), (4, 7)),
        ("fused_recurrent", (1, 0, 1, 1), (0, 5, 8)),
        ("fused_recurrent", (1, 0, 1, 1), (1, 6, 9))]
    assert all(c.case.final_state and not c.case.dht for c in calls)
    # a binding without the decode variant steps through the prefill's (one token per request)
    refuse = lambda c: "no decode kernel" if c.variant == "fused_recurrent" else None  # noqa: E731
    assert {c.case.variant for c in chain(GDN, _case(decode=3), refuse)} == {"chunk"}
    # unpacked rows: every row the same split; a first step with no h0 and no prefill starts from zeros
    rows = chain(GDN, Case("gdn", "chunk", B=2, T=2, H=1, K=16, V=16, dtype="float32", gate=G,
                           options=(("decode", 2),)))
    assert [(c.case.T, c.case.h0, c.positions) for c in rows] == [(1, False, (0,)), (1, True, (1,))]


@pytest.mark.parametrize("options, h0, dht, message", [
    ({"pool": 8}, True, False, "needs at least 9"),
    ({"pool": 9}, False, False, "needs h0"),
    ({"pool": 0}, True, False, "positive int"),
    ({"decode": 2}, True, True, "drop dht"),
    ({"decode": 2, "conv1d": 4, "use_qk_l2norm_in_kernel": True}, True, False, "conv"),
    ({"state_dtype": "fp32"}, True, False, "is the default"),
    ({"state_dtype": "float32"}, True, False, "is the default"),
    ({"state_dtype": "int8"}, True, False, r"one of \('bf16', 'fp16'\)"),
    ({"state_dtype": 1}, True, False, r"one of \('bf16', 'fp16'\)"),
    ({"state_dtype": "bf16"}, True, True, "drop dht"),
])
def test_bad_serving_options_say_the_fix(options, h0, dht, message):
    case = _case(**options).replace(h0=h0, dht=dht)
    with pytest.raises(ValueError, match=message):
        REGISTRY["gdn"].validate(case)


def test_state_dtype_of_a_case_without_a_state_is_refused():
    with pytest.raises(ValueError, match="which h0 holds .* add h0"):
        REGISTRY["gdn"].validate(_case(state_dtype="bf16").replace(h0=False))


def test_state_dtype_sets_the_state_tensors_dtypes_and_nothing_else():
    """h0 (the pool) drawn in the cache's dtype and ht declared in it; every other input and tensor as without the
    option; forward only (no gradient compared)."""
    op = REGISTRY["gdn"]
    for label, name in (("bf16", "bfloat16"), ("fp16", "float16")):
        case = _case(pool=9, state_dtype=label)
        plain = _case(pool=9)
        dtypes = {spec.name: spec.resolve_dtype(case) for spec in op.inputs(case)}
        assert dtypes == {**{spec.name: spec.resolve_dtype(plain) for spec in op.inputs(plain)}, "h0": name}
        assert [(t.name, t.resolve_dtype(case)) for t in op.tensors(case)] == [("o", "float32"), ("ht", name)]
        assert op.differentiable(case) == []
        x = make_inputs(case, op.inputs(case))
        assert x["h0"].dtype == np.dtype(name if name != "bfloat16" else ml_dtypes.bfloat16)
        assert x["h0"].shape == (9, 1, 16, 16)


@pytest.mark.parametrize("framework", ["numpy", "jax", "torch"])
def test_write_back_rounds_to_nearest_even_by_hand(framework):
    """bf16 keeps 8 significant bits: spacing 2^-7 on [1, 2). 1 + 2^-8 is a tie between 1 and 1 + 2^-7 and goes to
    1 (even); 1 + 3 * 2^-8 is a tie between 1 + 2^-7 and 1 + 2^-6 and goes to 1 + 2^-6 (even); 1 + 2^-8 + 2^-20 is
    above the tie and goes up. fp16 keeps 11: 1 + 2^-11 is a tie and goes to 1, 1 + 3 * 2^-11 to 1 + 2^-9."""
    values = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, 1 + 2 ** -11, 1 + 3 * 2 ** -11],
                      np.float32)
    want = {"bfloat16": [1.0, 1 + 2 ** -6, 1 + 2 ** -7, 1.0, 1.0],
            "float16": [1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8, 1.0, 1 + 2 ** -9]}
    for dtype, expected in want.items():
        if framework == "numpy":
            got = write_back(values, dtype)
        elif framework == "jax":
            import jax.numpy as jnp

            got = write_back(jnp.asarray(values), dtype)
        else:
            import torch

            got = write_back(torch.tensor(values), dtype)
        assert str(got.dtype).rsplit(".", 1)[-1] == dtype
        got64 = np.asarray(got.float() if framework == "torch" else got, dtype=np.float64)
        np.testing.assert_array_equal(got64, expected)
    assert write_back(None, "bfloat16") is None


def _add_2_to_the_minus_8(case, t):
    """A toy forward: each call adds 2^-8 to every state entry, in float32, and returns it in float32."""
    h0 = t.get("h0")
    h = np.zeros((case.num_seqs, 1, 1, 1), np.float32) if h0 is None else h0.astype(np.float32)
    return {"o": t["q"], "ht": h + np.float32(2 ** -8)}


def test_the_cache_rounds_the_state_at_every_call_boundary_by_hand():
    """Each call adds 2^-8 to a state of 1 (a tie in bf16: back to 1). With a bf16 cache the state is written back
    after every call: four calls (a prefill, three decode steps) leave 1 + 0 = 1 in bf16, while the float32 state
    carries 1 + 4 * 2^-8. In fp16 (spacing 2^-10 on [1, 2)) each addition survives: 1 + 4 * 2^-8, exactly."""
    binding = LegBinding(_add_2_to_the_minus_8)
    case = Case("gdn", "chunk", B=1, T=4, H=1, K=1, V=1, dtype="float32", gate=G, h0=True)
    q = np.zeros((1, 4, 1, 1), np.float32)
    for label, h0_dtype, want in (("bf16", ml_dtypes.bfloat16, 1.0), ("fp16", np.float16, 1 + 4 * 2 ** -8)):
        c = case.replace(options=(("decode", 3), ("state_dtype", label)))
        assert len(chain(GDN, c)) == 4
        out = served_forward(GDN, binding)(c, {"q": q, "h0": np.ones((1, 1, 1, 1), h0_dtype)})
        assert out["ht"].dtype == np.dtype(h0_dtype)
        assert float(out["ht"].astype(np.float64).item()) == want
    out = served_forward(GDN, binding)(case.replace(options=(("decode", 3),)), {"q": q, "h0": np.ones((1, 1, 1, 1),
                                                                                                  np.float32)})
    assert out["ht"].dtype == np.float32 and float(out["ht"].item()) == 1 + 4 * 2 ** -8  # no option: as returned


def test_a_binding_that_cannot_take_the_dtype_refuses_with_its_reason():
    why = "its kernel casts the state to float32 and returns it so"
    binding = served_binding(GDN, LegBinding(_add_2_to_the_minus_8,
                                             state_dtype=lambda d: why if d == "float16" else None))
    case = _case(state_dtype="fp16")
    assert binding.supports(case) == why
    assert binding.supports(_case(state_dtype="bf16")) is None
    assert binding.supports(_case()) is None
    assert binding.describe(_case(state_dtype="bf16"))["state_cache"] == "bfloat16"


def test_decode_of_the_decode_variant_is_refused():
    with pytest.raises(ValueError, match="pass variant='chunk'"):
        REGISTRY["gdn"].validate(_case(decode=2).replace(variant="fused_recurrent"))


def test_pool_gradient_by_hand():
    """Slots 0..4, requests reading (1, 2) and writing (1, 3), the second without an initial state."""
    s = Slots(size=5, read=(1, 2), write=(1, 3), has_initial_state=(True, False))
    dht = np.arange(5.0)[:, None]
    dh0 = np.array([[10.0], [20.0]])
    got = pool_gradient(dht, dh0, s, dht)
    # 0, 2, 4 pass dht through; 1 and 3 were overwritten (their dht is not the old value's); slot 1 was read
    np.testing.assert_array_equal(got[:, 0], [0.0, 10.0, 2.0, 0.0, 4.0])
    np.testing.assert_array_equal(pool_gradient(None, dh0, s, dht)[:, 0], [0.0, 10.0, 0.0, 0.0, 0.0])


# ----------------------------------------------------------------- the reference, against independent computations
POOLED = [c for c in serving_cases() if "pool" in c.opt and "decode" not in c.opt and not RAW[c.op].per_sequence(c)]
DECODING = [c for c in serving_cases() if "decode" in c.opt]


def _close(got, want, what):
    scale = max(1.0, float(np.max(np.abs(want))))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * scale, err_msg=what)


@pytest.mark.heavy  # every serving case through the reference or a leg: pytest -m heavy (.ci/run)
@pytest.mark.parametrize("case", POOLED, ids=str)
def test_pooled_reference_is_each_request_on_its_own(case):
    """Each request alone (an unpacked case of its own tokens, its state read from its slot or zeros), then the
    pool assembled by hand: o, ht, every gradient to 1e-12; untouched slots bit for bit."""
    op, raw = REGISTRY[case.op], RAW[case.op]
    x = make_inputs(case, op.inputs(case)).as_float64()
    got = op.reference(case, x, method="chunk")
    base, s = inner(case), slots(case)
    pool, dht = x["h0"], x.get("dht")
    want = {"ht": pool.copy(), "dh0": np.zeros_like(pool) if dht is None else dht.copy()}
    want["dh0"][list(s.write)] = 0
    o = np.zeros_like(got["o"])
    grads = {t.name: np.zeros_like(got[t.name]) for t in op.tensors(case) if t.kind == "grad" and t.name != "dh0"}
    for i, (bos, eos) in enumerate(zip(base.cu_seqlens[:-1], base.cu_seqlens[1:])):
        h0 = pool[s.read[i]] if s.has_initial_state[i] else np.zeros_like(pool[0])
        if eos == bos:  # an empty request: its state passes through, and so does its gradient
            want["ht"][s.write[i]] = h0
            if s.has_initial_state[i] and dht is not None:
                want["dh0"][s.read[i]] += dht[s.write[i]]
            continue
        one = base.replace(lens=None, T=eos - bos)
        xi = {n: (a[:, bos:eos] if per_token(base, a.shape) else a) for n, a in x.items()}
        xi["h0"] = h0[None]
        if dht is not None:
            xi["dht"] = dht[s.write[i]][None]
        out = raw.reference(one, xi, method="chunk")
        o[:, bos:eos] = out["o"]
        want["ht"][s.write[i]] = out["ht"][0]
        if s.has_initial_state[i]:
            want["dh0"][s.read[i]] += out["dh0"][0]
        for name in grads:
            g = out[name]
            if per_token(one, g.shape):
                grads[name][:, bos:eos] = g
            else:  # a parameter every request shares: the requests' gradients add
                grads[name] += g
    _close(got["o"], o, "o")
    _close(got["ht"], want["ht"], "ht")
    _close(got["dh0"], want["dh0"], "dh0")
    for name, g in grads.items():
        _close(got[name], g, name)
    np.testing.assert_array_equal(got["ht"][list(s.kept)], pool[list(s.kept)])
    assert all(a.dtype == np.float64 for a in got.values())


@pytest.mark.heavy  # every serving case through the reference or a leg: pytest -m heavy (.ci/run)
@pytest.mark.parametrize("case", DECODING, ids=str)
def test_decode_reference_is_a_prefill_then_recurrent_steps(case):
    """The served reference computes a decode case in one chunked call; here the prefill runs chunked and every
    step through the reference's token-by-token recurrence, each from the state the last one left."""
    op, raw = REGISTRY[case.op], RAW[case.op]
    x = make_inputs(case, op.inputs(case)).as_float64()
    got = op.reference(case, x, method="chunk")
    s = slots(case)

    def step(c, t):
        return raw.reference(c, t, method="recurrent" if c.variant == raw.decode_variant else "chunk")

    t = dict(x)
    t["h0"] = gather(x["h0"], s)
    want = run_chain(op, case, LegBinding(step), t)
    assert len(chain(op, case)) == 4  # the prefill and three steps
    _close(got["o"], want["o"], "o")
    _close(got["ht"], scatter(x["h0"], want["ht"], s), "ht")
    assert set(got) == {"o", "ht"}  # forward only


# ----------------------------------------------------------------- the pool in the legs' frameworks
def _toy(case, t):
    """A binding standing in for a kernel: ht = 2 h0 + the sum of q over tokens, o = q."""
    return {"o": t["q"], "ht": 2 * t["h0"] + t["q"].sum()}


def test_served_forward_autodiff_is_the_pool_chain_rule():
    import jax
    import jax.numpy as jnp

    from references._x64 import float64_cpu

    with float64_cpu():  # scoped: a global jax_enable_x64 would change every later test in this process
        _check_the_pool_chain_rule_in_jax_and_torch(jax, jnp)


def _check_the_pool_chain_rule_in_jax_and_torch(jax, jnp):
    case = _case(pool=9)
    s = slots(case)
    rng = np.random.default_rng(3)
    pool = rng.standard_normal((9, 1, 2, 2))
    q = rng.standard_normal((1, case.T, 1, 2))
    dht = rng.standard_normal(pool.shape)
    forward = served_forward(REGISTRY["gdn"], LegBinding(_toy))
    out, vjp = jax.vjp(lambda p: forward(case, {"h0": p, "q": jnp.asarray(q)})["ht"], jnp.asarray(pool))
    (dpool,) = vjp(jnp.asarray(dht))
    assert np.asarray(dpool).dtype == np.float64
    dh0 = 2 * dht[list(s.write)]  # the toy's gradient of each request's initial state
    np.testing.assert_allclose(np.asarray(dpool), pool_gradient(dht, dh0, s, pool), rtol=0, atol=1e-15)
    np.testing.assert_array_equal(np.asarray(out)[list(s.kept)], pool[list(s.kept)])
    # the new request (no initial state) starts from zeros, not from its read slot: its ht is the toy's q term
    np.testing.assert_allclose(np.asarray(out)[s.write[2]], np.full((1, 2, 2), q.sum()), rtol=1e-15)

    import torch

    tp = torch.tensor(pool, requires_grad=True)
    ht = served_forward(REGISTRY["gdn"], LegBinding(_toy))(case, {"h0": tp, "q": torch.tensor(q)})["ht"]
    (tgrad,) = torch.autograd.grad(ht, tp, torch.tensor(dht))
    np.testing.assert_allclose(tgrad.numpy(), np.asarray(dpool), rtol=0, atol=1e-15)


# ----------------------------------------------------------------- the legs
@pytest.mark.heavy  # every serving case through the reference or a leg: pytest -m heavy (.ci/run)
@pytest.mark.parametrize("leg", ["tpu", "gpu"])
def test_legs_keep_unwritten_slots_bit_for_bit(leg):
    from harness.legs.registry import make_leg

    case = serving_cases()[0]
    op = REGISTRY[case.op]
    inputs = make_inputs(case, op.inputs(case))
    out = make_leg(leg, **({"compile_targets": ()} if leg == "tpu" else {})).run(op, case, inputs).tensors
    s = slots(case)
    kept = list(s.kept)
    assert out["ht"].shape == inputs.arrays["h0"].shape == (11, *case.state_shape[1:])
    np.testing.assert_array_equal(out["ht"][kept].view(np.uint32), inputs.arrays["h0"][kept].view(np.uint32))
    assert not np.array_equal(out["ht"][list(s.write)], inputs.arrays["h0"][list(s.write)])
    # the gradient of a slot no request names is the cotangent, passed through exactly
    np.testing.assert_array_equal(out["dh0"][10], inputs.arrays["dht"][10])


@pytest.mark.heavy  # fla under the Triton interpreter
def test_the_fla_leg_writes_a_bf16_cache_as_fla_s_in_place_decode_does():
    """vLLM decodes kda from its state cache in place: fla's ``fused_recurrent_kda_fwd`` with
    ``inplace_final_state`` reads each request's slot by ``ssm_state_indices`` and stores the float32 state back
    into the bf16 pool in the kernel (fla 0.6.0's public ``fused_recurrent_kda`` always passes
    ``inplace_final_state=False``). The GPU leg calls the public function on the gathered states and the serving
    wrapper writes each back in the cache's dtype: the same pool, bit for bit (the kernel's store and torch's cast
    both round to nearest even), and the same o."""
    import torch

    from harness.legs.gpu import to_numpy, to_torch
    from harness.legs.registry import make_leg

    case = Case("kda", "fused_recurrent", B=1, T=3, H=1, K=32, V=32, dtype="bfloat16", gate=G, h0=True,
                lens=(1, 1, 1), options=(("state_dtype", "bf16"),))
    op = REGISTRY["kda"]
    inputs = make_inputs(case, op.inputs(case))
    leg = make_leg("gpu")  # interpreter mode first: fla is imported after it
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    served = leg.run(op, case, inputs).tensors
    assert served["ht"].dtype == ml_dtypes.bfloat16
    index = [5, 0, 3]  # request i's slot in a pool of 7: read and written in place
    pool = np.full((7, *case.state_shape[1:]), 0.5, ml_dtypes.bfloat16)
    pool[index] = inputs["h0"]
    t = {name: to_torch(a, "cpu") for name, a in inputs.arrays.items()}
    cache = to_torch(pool, "cpu")
    with leg._scope():
        o, _ = fused_recurrent_kda_fwd(t["q"], t["k"], t["v"], t["g"], t["beta"], scale=case.resolved_scale,
                                       initial_state=cache, inplace_final_state=True,
                                       ssm_state_indices=torch.tensor(index, dtype=torch.int32),
                                       cu_seqlens=torch.tensor(case.cu_seqlens, dtype=torch.long))
    after = to_numpy(cache)
    assert not np.array_equal(after[index].view(np.uint16), pool[index].view(np.uint16))  # the decode wrote them
    np.testing.assert_array_equal(after[index].view(np.uint16), served["ht"].view(np.uint16))
    kept = [s for s in range(7) if s not in index]
    np.testing.assert_array_equal(after[kept].view(np.uint16), pool[kept].view(np.uint16))
    np.testing.assert_array_equal(to_numpy(o).view(np.uint16), served["o"].view(np.uint16))


def test_gate_parameter_gradient_is_the_sum_the_bound_describes():
    """The reference's dA_log is the sum harness.core.policy's bf16 dA_log bound reasons about, sum of dg * (g + dt_bias)
    over tokens and channels (the in-kernel gate lower_bound * sigmoid(exp(A_log) (g + dt_bias))), to 1e-12."""
    case = next(c for c in serving_cases() if c.op == "kda" and "pool" in c.opt and "decode" not in c.opt)
    op = REGISTRY["kda"]
    x = make_inputs(case, op.inputs(case)).as_float64()
    got = op.reference(case, x, method="chunk")
    terms = got["dg"] * (x["g"] + x["dt_bias"].reshape(case.HV, case.K))
    _close(got["dA_log"], terms.sum(axis=(0, 1, 3)), "dA_log")


def test_the_peers_serving_cases_file_is_the_suites_serving_cases():
    from cases.case_file import load_cases
    from cases.suites import gdn_serving_smoke

    from pathlib import Path

    from harness.ops import get_op

    path = Path(__file__).resolve().parent.parent / "cases" / "peers" / "serving.toml"
    listed = [c.id for c in load_cases(path, get_op)]
    assert listed == [c.id for c in serving_cases() + gdn_serving_smoke()]


def test_the_peers_state_cache_file_is_the_suites_state_cache_cases():
    from pathlib import Path

    from cases.case_file import load_cases
    from cases.suites import state_cache_cases
    from harness.ops import get_op

    path = Path(__file__).resolve().parent.parent / "cases" / "peers" / "state-cache.toml"
    assert [c.id for c in load_cases(path, get_op)] == [c.id for c in state_cache_cases()]


def test_the_wrapped_functions_a_cache_hashes_name_the_ops_modules():
    """A leg's cache keys on the files its functions come from (harness.run.baseline_cache.binding_fingerprint): the
    served wrappers lead it to the op's own modules, and serving.py is hashed for every leg besides."""
    from harness.run.baseline_cache import COMMON_SOURCES, source_file

    kda = REGISTRY["kda"]
    assert source_file(kda.differentiable).endswith("harness/ops/delta_rule.py")
    for fn in (kda.reference, kda.fla.forward, kda.fla.describe, kda.pallas.forward):
        assert source_file(fn).endswith("harness/ops/kda.py"), fn
    assert "harness/ops/serving.py" in COMMON_SOURCES


def test_the_serving_peers_state_cache_and_drift_cases_are_forward_only_cache_cases():
    """cases/peers/state-cache-peers.toml (the serving peers at a bf16/fp16 cache) and the drift table's cases
    (reports/state-dtype/drift-cases.toml: each call at a bf16, an fp16 and a float32 cache) stay well-formed: every
    peer case names a low-precision cache and compares its forward only, and each drift call comes at all three."""
    from pathlib import Path

    from cases.case_file import load_cases
    from harness.ops import get_op
    from harness.ops.serving import split, state_dtype

    root = Path(__file__).resolve().parent.parent
    peers = load_cases(root / "cases" / "peers" / "state-cache-peers.toml", get_op)
    assert peers and all(state_dtype(c) in ("bfloat16", "float16") for c in peers)
    for case in peers:
        assert {t.name for t in get_op(case.op).tensors(case)} <= {"o", "ht", "conv_ht"}, case.id
    drift = load_cases(root / "reports" / "state-dtype" / "drift-cases.toml", get_op)
    calls: dict[str, set] = {}
    for case in drift:
        assert split(case)[1].get("decode") == 24, case.id
        calls.setdefault(split(case)[0].id, set()).add(state_dtype(case))
    assert all(dtypes == {"bfloat16", "float16", "float32"} for dtypes in calls.values()), calls
