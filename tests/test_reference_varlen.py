"""Packed variable-length sequences (fla's ``cu_seqlens``): the case model, the references, the contract.

The references' packed semantics (fla-core 0.6.0) are: the state resets at every sequence start
(sequence i starts from initial_state[i], or zero), chunking restarts there (no chunk spans a
boundary) and ht[i] is sequence i's final state. So a packed run is N separate runs:

    o = concat_i o_i (along T),  ht = stack_i ht_i,  per-token grads = concat_i,  dh0 = stack_i dh0_i,
    d(shared parameter) = sum_i d_i    (g_gamma, kda's A_log and dt_bias: the packed loss is sum_i loss_i)

where run i sees tokens [c_i, c_{i+1}) alone with B = 1, initial_state[i:i+1] and dht[i:i+1].
Tolerance: relative L2 error ||packed - separate|| / ||separate|| <= 1e-12 per tensor.

The lengths put boundaries inside chunks (chunk_size 32: boundaries at 37 and 38, a sequence of one
token, and sequences of 37 and 90 tokens whose last chunks are short). A numpy loop with explicit
state resets checks the packed forward independently of the references' per-sequence slicing.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from cases import suites
from cases.case import Case, Gate
from cases.inputs import InputSpec, make_inputs, normal
from references import gla, kda, simple_gla
from harness.ops import get_op

LENS = (37, 1, 90)  # T = 128; with C = 32 the boundaries 37 and 38 fall inside the chunk [32, 64)
CU = np.cumsum((0,) + LENS)
T, H, K, V, C, N = sum(LENS), 2, 16, 16, 32, len(LENS)
TOL = 1e-12


def rel(x, y) -> float:
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    return float(np.linalg.norm(x - y) / np.linalg.norm(y))


def draw(op: str, seed: int = 0) -> dict:
    """float64 inputs of one packed row [1,T,H,*], N states, every optional array the op takes."""
    rng = np.random.default_rng(seed)
    n = lambda *s: rng.standard_normal(s)  # noqa: E731
    logsig = lambda *s: -np.logaddexp(0.0, -n(*s)) / 4  # noqa: E731  log decays <= 0
    x = dict(q=n(1, T, H, K), k=n(1, T, H, K), v=n(1, T, H, V), do=n(1, T, H, V), h0=n(N, H, K, V),
             dht=n(N, H, K, V), g_gamma=-np.array([0.7, 0.05]))
    x["g"] = logsig(1, T, H) if op == "simple_gla" else logsig(1, T, H, K)
    if op == "kda":
        x["q"] /= np.linalg.norm(x["q"], axis=-1, keepdims=True)
        x["k"] /= np.linalg.norm(x["k"], axis=-1, keepdims=True)
        x["beta"] = 1 / (1 + np.exp(-n(1, T, H)))
        x["g_raw"], x["beta_raw"], x["A_log"], x["dt_bias"] = n(1, T, H, K), n(1, T, H), n(H), n(H * K)
    return x


# ------------------------------------------------------------ op bindings
GATED = {"simple_gla": (simple_gla.chunk_simple_gla, simple_gla.chunk_simple_gla_bwd),
         "gla": (gla.chunk_gla, gla.chunk_gla_bwd)}
# (op, name, with_state) -> how the op is called: its gate kind, or kda's options
CONFIGS = {
    ("simple_gla", "g", True): dict(gate="g"),
    ("simple_gla", "g_gamma", False): dict(gate="g_gamma"),
    ("gla", "g", False): dict(gate="g"),
    ("gla", "g_gamma", True): dict(gate="g_gamma"),
    ("kda", "plain", True): dict(opts={}),
    # in-op gate from A_log/dt_bias (shared parameters), l2norm and beta sigmoid: all per token
    ("kda", "in-op gate+l2norm+sigmoid", True): dict(opts=dict(use_gate_in_kernel=True, use_qk_l2norm_in_kernel=True,
                                                                use_beta_sigmoid_in_kernel=True)),
}
SHARED = ("dg_gamma", "dA_log", "ddt_bias")  # gradients of per-head parameters: summed over sequences
PER_STATE = ("dh0",)


def run(op, cfg, x, sl, states, method, cu_seqlens=None):
    """Forward (o, ht) and backward grads of ``op`` on tokens ``sl`` with state rows ``states``."""
    tok = lambda name: x[name][:, sl]  # noqa: E731
    h0 = None if states is None else x["h0"][states]
    dht = None if states is None else x["dht"][states]
    common = dict(initial_state=h0, method=method, chunk_size=C, cu_seqlens=cu_seqlens)
    if op in GATED:
        fwd, bwd = GATED[op]
        gate = {cfg["gate"]: tok("g") if cfg["gate"] == "g" else x["g_gamma"]}
        o, ht = fwd(tok("q"), tok("k"), tok("v"), **gate, output_final_state=True, **common)
        grads = bwd(tok("q"), tok("k"), tok("v"), tok("do"), dht, **gate, **common)
    else:
        opts = cfg["opts"]
        in_op_gate = opts.get("use_gate_in_kernel", False)
        g = tok("g_raw") if in_op_gate else tok("g")
        beta = tok("beta_raw") if opts.get("use_beta_sigmoid_in_kernel") else tok("beta")
        params = dict(A_log=x["A_log"], dt_bias=x["dt_bias"]) if in_op_gate else {}
        o, ht = kda.chunk_kda(tok("q"), tok("k"), tok("v"), g, beta, output_final_state=True, **params, **common,
                              **opts)
        grads = kda.chunk_kda_bwd(tok("q"), tok("k"), tok("v"), g, beta, tok("do"), dht, **params, **common, **opts)
    return {"o": o, "ht": ht, **{n: a for n, a in grads.items() if a is not None}}


# kda's in-op options act token by token before the core, the same for both methods: chunk only (compile time)
RUNS = [(key, method) for key in CONFIGS for method in ("chunk", "recurrent")
        if not (key[1].startswith("in-op") and method == "recurrent")]


@pytest.mark.parametrize("key, method", RUNS, ids=[f"{k[0]}[{k[1]}]{'-h0' if k[2] else ''}-{m}" for k, m in RUNS])
def test_packed_equals_separate_runs(key, method):
    op, _, with_state = key
    cfg = CONFIGS[key]
    x = draw(op)
    packed = run(op, cfg, x, slice(None), slice(None) if with_state else None, method, cu_seqlens=CU)
    parts = [run(op, cfg, x, slice(CU[i], CU[i + 1]), slice(i, i + 1) if with_state else None, method)
             for i in range(N)]
    assert packed["o"].shape == (1, T, H, V) and packed["ht"].shape == (N, H, K, V)
    assert set(packed) == set(parts[0]), "the packed run returns the same gradients as a single sequence"
    assert ("dh0" in packed) == with_state
    for name, got in packed.items():
        assert got.dtype == np.float64, name
        if name in SHARED:
            want = np.sum([p[name] for p in parts], axis=0)
        elif name == "ht" or name in PER_STATE:
            want = np.concatenate([p[name] for p in parts], axis=0)
        else:  # o and every per-token gradient
            want = np.concatenate([p[name] for p in parts], axis=1)
        assert got.shape == want.shape, name
        assert rel(got, want) <= TOL, (name, rel(got, want))


def numpy_packed_simple_gla(q, k, v, g, h0, cu, scale):
    """Token loop over the packed row with an explicit state reset at each sequence start."""
    o = np.zeros((1, T, H, V))
    ht = np.zeros((N, H, K, V))
    for i in range(len(cu) - 1):
        S = h0[i].copy()  # [H,K,V]: sequence i starts from its own state, never from sequence i-1's
        for t in range(cu[i], cu[i + 1]):
            S = np.exp(g[0, t])[:, None, None] * S + k[0, t][:, :, None] * v[0, t][:, None, :]
            o[0, t] = scale * np.einsum("hk,hkv->hv", q[0, t], S)
        ht[i] = S
    return o, ht


@pytest.mark.parametrize("method", ["chunk", "recurrent"])
def test_packed_forward_matches_a_numpy_loop_with_state_resets(method):
    x = draw("simple_gla", seed=1)
    o_np, ht_np = numpy_packed_simple_gla(x["q"], x["k"], x["v"], x["g"], x["h0"], CU, K ** -0.5)
    o, ht = simple_gla.chunk_simple_gla(x["q"], x["k"], x["v"], g=x["g"], initial_state=x["h0"],
                                        output_final_state=True, cu_seqlens=CU, method=method, chunk_size=C)
    assert rel(o, o_np) <= TOL and rel(ht, ht_np) <= TOL
    # not packed, the same row is one sequence: the states would leak across the boundaries
    o1, _ = simple_gla.chunk_simple_gla(x["q"], x["k"], x["v"], g=x["g"], initial_state=x["h0"][:1],
                                        method=method, chunk_size=C)
    assert rel(o1[:, CU[1]:], o_np[:, CU[1]:]) > 1e-3


def test_cu_seqlens_forms_and_naive_entry_point():
    """A list, a numpy int32 array and a jax array give the same result; the naive recurrence takes them too."""
    import jax.numpy as jnp

    x = draw("simple_gla", seed=2)
    args = (x["q"], x["k"], x["v"])
    want, want_ht = simple_gla.chunk_simple_gla(*args, g=x["g"], output_final_state=True, cu_seqlens=CU,
                                                chunk_size=C)
    for cu in (list(map(int, CU)), CU.astype(np.int32), jnp.asarray(CU, dtype=jnp.int32)):
        o, ht = simple_gla.naive_recurrent_simple_gla(*args, g=x["g"], output_final_state=True, cu_seqlens=cu)
        assert rel(o, want) <= TOL and rel(ht, want_ht) <= TOL


# ------------------------------------------------------------ the contract
def _fns():
    """Every reference entry point that takes cu_seqlens, called on valid inputs plus ``change``."""
    xs = {op: draw(op) for op in ("simple_gla", "gla", "kda")}

    def call(op, fn, takes_do, change):
        x = xs[op]
        kw = dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], do=x["do"], cu_seqlens=CU)
        if op == "kda":
            kw["beta"] = x["beta"]
        kw.update(change(x))
        if not takes_do:
            kw.pop("do")
        return fn(**{n: a for n, a in kw.items() if a is not None})

    return [(name, lambda change, op=op, fn=fn, d=d: call(op, fn, d, change)) for name, op, fn, d in (
        ("simple_gla.chunk_simple_gla", "simple_gla", simple_gla.chunk_simple_gla, False),
        ("simple_gla.chunk_simple_gla_bwd", "simple_gla", simple_gla.chunk_simple_gla_bwd, True),
        ("simple_gla.naive_recurrent_simple_gla", "simple_gla", simple_gla.naive_recurrent_simple_gla, False),
        ("gla.chunk_gla", "gla", gla.chunk_gla, False),
        ("gla.chunk_gla_bwd", "gla", gla.chunk_gla_bwd, True),
        ("kda.chunk_kda", "kda", kda.chunk_kda, False),
        ("kda.chunk_kda_bwd", "kda", kda.chunk_kda_bwd, True),
    )]


BAD_CU = [
    ("not_starting_at_0", dict(cu_seqlens=np.array([1, 37, 128])),
     r"^cu_seqlens must start at 0, got cu_seqlens\[0\]=1$"),
    ("decreasing", dict(cu_seqlens=[0, 64, 37, 128]), r"^cu_seqlens must be non-decreasing .* "
                                                       r"cu_seqlens\[1\]=64 > cu_seqlens\[2\]=37$"),
    ("short_of_T", dict(cu_seqlens=np.array([0, 37, 120])),
     r"^cu_seqlens must end at T=128 \(the packed length of q, k, v\), got cu_seqlens\[-1\]=120$"),
    ("float", dict(cu_seqlens=CU.astype(np.float32)), r"^cu_seqlens must hold integer offsets, got "
                                                      r"cu_seqlens.dtype=float32; pass int32 or int64 offsets$"),
    ("bool", dict(cu_seqlens=np.array([False, True])),
     r"^cu_seqlens must hold integer offsets, got cu_seqlens.dtype=bool"),
    ("2d", dict(cu_seqlens=CU[None]),
     r"^cu_seqlens must be a 1-D array of N\+1 >= 2 integer offsets .*, got \(1, 4\)$"),
    ("one_offset", dict(cu_seqlens=[0]), r"^cu_seqlens must be a 1-D array of N\+1 >= 2 .*, got \(1,\)$"),
    ("scalar", dict(cu_seqlens=128), r"^cu_seqlens must be a 1-D array of N\+1 >= 2 .*, got int$"),
]
BAD_SHAPES = [  # the packed row and the per-sequence states
    ("batch_of_2", lambda x: {n: np.concatenate([x[n]] * 2) for n in ("q", "k", "v", "g", "beta", "do") if n in x},
     r"^cu_seqlens packs sequences along T of one batch row, so B must be 1, got B=2; flatten the batch"),
    ("one_h0_for_3_sequences", lambda x: dict(initial_state=x["h0"][:1]),
     r"^initial_state must be \[N,H,K,V\] = \(3, 2, 16, 16\), got \(1, 2, 16, 16\)$"),
]


@pytest.mark.parametrize("bad", BAD_CU + BAD_SHAPES, ids=lambda b: b[0])
def test_bad_cu_seqlens_is_one_line_value_error_from_every_reference(bad):
    _, change, pattern = bad
    change_fn = change if callable(change) else (lambda x, c=change: c)
    messages = {}
    for name, fn in _fns():
        with pytest.raises(ValueError) as info:
            fn(change_fn)
        assert type(info.value) is ValueError, (name, info.value)
        messages[name] = str(info.value)
    assert len(set(messages.values())) == 1, messages  # one message, word for word, from every entry point
    message = messages.popitem()[1]
    assert "\n" not in message and re.search(pattern, message), message


def test_dht_per_sequence_is_checked():
    x = draw("gla")
    with pytest.raises(ValueError, match=r"^dht must be \[N,H,K,V\] = \(3, 2, 16, 16\), got \(1, 2, 16, 16\)$"):
        gla.chunk_gla_bwd(x["q"], x["k"], x["v"], x["do"], x["dht"][:1], g=x["g"], cu_seqlens=CU)


def test_traced_cu_seqlens_is_checked_for_shape_only():
    """Inside jit the offsets' values are unknown (as a traced gate's): rank, length, dtype and B still are."""
    import jax

    from op_contract import Dims, check_cu_seqlens

    dims = Dims(1, T, H, K, V)
    assert jax.jit(lambda c: check_cu_seqlens(c, dims) * 0 + c[0])(np.array([5, 9, 3])) == 5  # values unchecked
    with pytest.raises(ValueError, match="integer offsets"):
        jax.jit(lambda c: check_cu_seqlens(c, dims))(CU.astype(np.float32))
    assert check_cu_seqlens(CU, dims) == N and check_cu_seqlens(CU.tolist(), dims) == N


# ------------------------------------------------------------ the case model
def _case(**kw):
    base = dict(op="simple_gla", variant="chunk", B=1, T=128, H=2, K=128, V=128, dtype="bfloat16", gate=Gate(),
                chunk_size=64, h0=True, dht=True, lens=(37, 64, 27))
    return Case(**{**base, **kw})


def test_packed_case_id_names_the_lengths():
    c = _case()
    assert c.id == "simple_gla.chunk/B1-T128-H2-K128-V128/bf16/g=logsigmoid/16/C64/lens=37+64+27,h0,dht"
    assert _case(h0=False, dht=False).id.endswith("/C64/lens=37+64+27")
    assert c.replace(seed=3).id.endswith("/C64/lens=37+64+27,h0,dht,seed=3")
    assert c.cu_seqlens == (0, 37, 101, 128) and c.num_seqs == 3 and c.state_shape == (3, 2, 128, 128)
    assert c.num_chunks == 1 + 1 + 1  # 37, 64 and 27 tokens: one chunk of 64 each, none spanning a boundary
    assert _case(lens=(100, 28)).num_chunks == 2 + 1
    assert _case(lens=None).cu_seqlens is None and _case(lens=None).num_seqs == 1
    assert _case(lens=[37, 64, 27]) == c and hash(_case(lens=[37, 64, 27])) == hash(c)  # a list is kept as a tuple


def test_packed_case_ids_are_unique_and_stable():
    variants = [_case(lens=None), _case(lens=(128,)), _case(lens=(64, 64)), _case(lens=(37, 64, 27)),
                _case(lens=(27, 64, 37)), _case(lens=(37, 91)), _case(lens=(3, 7, 64, 54))]
    ids = [c.id for c in variants]
    assert len(set(ids)) == len(ids)  # the order of the sequences matters, and so does packing at all
    assert [Case(**{f: getattr(c, f) for f in c.__dataclass_fields__}).id for c in variants] == ids
    assert len({c.rng_seed for c in variants}) == len(variants)


def test_packed_case_id_round_trips_through_find_case(monkeypatch):
    """find_case (the one-line repro) looks ids up in the suites, draws included."""
    cases = [_case(), _case(lens=(27, 64, 37)), _case(lens=(128,)), _case(lens=None)]
    monkeypatch.setitem(suites.SUITES, "varlen-test", (lambda: cases,))
    for c in cases:
        assert suites.find_case(c.id, get_op) == c
        assert suites.find_case(c.replace(seed=4).id, get_op) == c.replace(seed=4)


@pytest.mark.parametrize("kw, match", [
    (dict(B=2), r"^lens=\(37, 64, 27\) packs sequences along T of one batch row: B must be 1, got B=2$"),
    (dict(T=127), r"^lens=\(37, 64, 27\) packs sum\(lens\)=128 tokens: T must equal it, got T=127$"),
    (dict(lens=(38, -1, 91)), r"^lens=\(38, -1, 91\) must be a non-empty tuple of non-negative ints, not all 0"),
    (dict(lens=()), r"^lens=\(\) must be a non-empty tuple of non-negative ints"),
    (dict(T=1, lens=(0, 0)), r"^lens=\(0, 0\) must be a non-empty tuple of non-negative ints, not all 0"),
    (dict(lens=(64.0, 64)), r"must be a non-empty tuple of non-negative ints"),
    (dict(lens=(True, 127)), r"must be a non-empty tuple of non-negative ints"),
    (dict(lens=128), r"^lens=128 must be a non-empty tuple of non-negative ints"),
    (dict(lens=None, options=(("lens", "37+64+27"),)), r"^options \['lens'\] are names the case id uses"),
])
def test_invalid_packed_cases(kw, match):
    with pytest.raises(ValueError, match=match) as info:
        _case(**kw)
    assert "\n" not in str(info.value)


def test_packed_case_draws_states_per_sequence():
    """State inputs take case.state_shape ([N,H,K,V]); the draw is deterministic and depends on the lengths."""
    specs = [InputSpec("q", lambda c: (c.B, c.T, c.H, c.K), "case", normal()),
             InputSpec("h0", lambda c: c.state_shape, "float32", normal()),
             InputSpec("dht", lambda c: c.state_shape, "float32", normal())]
    c = _case()
    a, b = make_inputs(c, specs), make_inputs(c, specs)
    assert a["h0"].shape == a["dht"].shape == (3, 2, 128, 128) and a["q"].shape == (1, 128, 2, 128)
    assert a.sha256 == b.sha256
    assert make_inputs(_case(lens=(27, 64, 37)), specs).sha256 != a.sha256
    assert make_inputs(_case(lens=None), specs)["h0"].shape == (1, 2, 128, 128)
