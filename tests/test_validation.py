"""One validation story: every reference and every kernel public function rejects the same bad input
with the same exception and the same message (the op contract, :mod:`op_contract`, checked once).

Validation runs before any computation or tracing, so each case is fast; kernels run with
``interpret=True`` and tiny shapes (K = V = 128, the kernels' lane width).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import references.gla
import references.kda
import references.simple_gla
import kernels_tpu.gla
import kernels_tpu.kda
import kernels_tpu.simple_gla

B, T, H, K, V = 1, 16, 1, 128, 128


def _inputs(op: str) -> dict:
    """Valid float32 inputs of ``op`` (log-decay gates <= 0) and the backward's ``do``."""
    rng = np.random.default_rng(0)
    n = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    logsigmoid = lambda *s: -np.logaddexp(0.0, -rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    x = dict(q=n(B, T, H, K), k=n(B, T, H, K), v=n(B, T, H, V), do=n(B, T, H, V))
    if op == "simple_gla":
        x["g"] = logsigmoid(B, T, H)
    else:
        x["g"] = logsigmoid(B, T, H, K)
    if op == "kda":
        x["beta"] = 1 / (1 + np.exp(-n(B, T, H)))
    return x


# every public function of each op: (name, fn, takes do, extra keywords)
IMPLEMENTATIONS = {
    "simple_gla": [
        ("references.chunk_simple_gla", references.simple_gla.chunk_simple_gla, False, {}),
        ("references.chunk_simple_gla_bwd", references.simple_gla.chunk_simple_gla_bwd, True, {}),
        *((f"kernels_tpu.{f}", getattr(kernels_tpu.simple_gla, f), f.endswith("_bwd"), dict(interpret=True))
          for f in ("chunk_simple_gla", "chunk_simple_gla_fwd", "chunk_simple_gla_bwd", "fused_chunk_simple_gla",
                    "fused_chunk_simple_gla_fwd", "fused_chunk_simple_gla_bwd")),
    ],
    "gla": [
        ("references.chunk_gla", references.gla.chunk_gla, False, {}),
        ("references.chunk_gla_bwd", references.gla.chunk_gla_bwd, True, {}),
        *((f"kernels_tpu.{f}", getattr(kernels_tpu.gla, f), f.endswith("_bwd"), dict(interpret=True))
          for f in ("chunk_gla", "chunk_gla_fwd", "chunk_gla_bwd")),
    ],
    "kda": [
        ("references.chunk_kda", references.kda.chunk_kda, False, {}),
        ("references.chunk_kda_bwd", references.kda.chunk_kda_bwd, True, {}),
        *((f"kernels_tpu.{f}", getattr(kernels_tpu.kda, f), f.endswith("_bwd"), dict(interpret=True))
          for f in ("chunk_kda", "chunk_kda_fwd", "chunk_kda_bwd")),
    ],
}


def _positive(a):
    a = a.copy()
    a.flat[3] = 0.5
    return a


# bad input: (id, change to the valid inputs, ops it applies to, a regex every message matches)
BAD = [
    *((f"chunk_size={c!r}", lambda x, c=c: dict(chunk_size=c), None, r"^chunk_size=.* must be a positive int$")
      for c in (0, -16, 16.5, True)),
    ("v_rank3", lambda x: dict(v=x["v"][..., 0]), None, r"^v must be a \[B,T,H,\*\] array, got \(1, 16, 1\)$"),
    ("v_rank5", lambda x: dict(v=x["v"][..., None]), None, r"^v must be a \[B,T,H,\*\] array"),
    ("q_int", lambda x: dict(q=x["q"].astype(np.int32)), None, r"^q must be floating point, got q.dtype=int32"),
    ("q_bool", lambda x: dict(q=x["q"] > 0), None, r"^q must be floating point, got q.dtype=bool"),
    *((f"scale={s}", lambda x, s=s: dict(scale=s), None, r"^scale must be None or a finite non-zero")
      for s in (0, 0.0, float("nan"), float("inf"))),
    ("g_positive", lambda x: dict(g=_positive(x["g"])), None, r"^g is a log decay.* got max\(g\) = 0\.5;"),
    ("g_gamma_positive", lambda x: dict(g=None, g_gamma=np.array([0.25], np.float32)), ("simple_gla", "gla"),
     r"^g_gamma is a log decay.* got max\(g_gamma\) = 0\.25;"),
    ("lower_bound_positive", lambda x: dict(use_gate_in_kernel=True, lower_bound=0.5), ("kda",),
     r"^lower_bound=0\.5 makes the in-kernel gate .* positive log decay"),
]


@pytest.mark.parametrize("op, bad", [pytest.param(op, b, id=f"{b[0]}-{op}") for b in BAD
                                     for op in sorted(IMPLEMENTATIONS) if b[2] is None or op in b[2]])
def test_every_implementation_rejects_the_same_way(op, bad):
    _, change, _, pattern = bad
    x = _inputs(op)
    raised = {}
    for impl, fn, takes_do, extra in IMPLEMENTATIONS[op]:
        kw = {**x, **change(x), **extra}
        if not takes_do:
            kw.pop("do")
        kw = {n: a for n, a in kw.items() if a is not None}
        with pytest.raises(ValueError) as info:
            fn(**kw)
        assert type(info.value) is ValueError, (impl, info.value)
        raised[impl] = str(info.value)
    messages = set(raised.values())
    assert len(messages) == 1, raised  # one message, word for word, from every implementation
    assert all(re.search(pattern, m) for m in messages), raised


def test_traced_gates_are_not_checked():
    """Inside jit/vjp the kernels cannot see a gate's values: the sign check applies to concrete gates only."""
    import jax

    x = _inputs("simple_gla")
    x["g"] = -x["g"]  # positive: rejected when concrete (above), not inspectable when traced
    fn = kernels_tpu.simple_gla.chunk_simple_gla_fwd
    out = jax.eval_shape(lambda g: fn(x["q"], x["k"], x["v"], g=g, interpret=True)[0], x["g"])
    assert out.shape == (B, T, H, V)


def test_raw_kda_gate_may_be_positive():
    """With use_gate_in_kernel=True kda's g is the raw gate input (any sign): the sign check is skipped."""
    from op_contract import check_kda

    x = _inputs("kda")
    opts = dict(use_qk_l2norm_in_kernel=False, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=False,
                allow_neg_eigval=False, safe_gate=False, lower_bound=None)
    check_kda(x["q"], x["k"], x["v"], -x["g"], x["beta"], opts=opts, A_log=np.zeros(H, np.float32))
    with pytest.raises(ValueError, match="g is a log decay"):
        check_kda(x["q"], x["k"], x["v"], -x["g"], x["beta"], opts={**opts, "use_gate_in_kernel": False})


def test_unimplemented_chunk_size_is_one_not_implemented_error_in_every_kernel():
    """chunk_size=10 is valid (the references run it) but no kernel implements it: the same
    NotImplementedError, saying the fix, from every kernel public function (one BlockSizes)."""
    messages = set()
    for op, impls in IMPLEMENTATIONS.items():
        x = _inputs(op)
        for impl, fn, takes_do, extra in impls:
            if not impl.startswith("kernels_tpu."):
                continue
            kw = {**x, **extra, "chunk_size": 10}
            if not takes_do:
                kw.pop("do")
            with pytest.raises(NotImplementedError) as info:
                fn(**kw)
            messages.add(str(info.value))
    assert len(messages) == 1 and "chunk_size=10; use chunk_size=64" in messages.pop()
