"""Every public kernel that carries a state takes a state cache's bf16 or fp16 initial state and returns its final
state in that dtype (``kernels_tpu.common.final_state``): inside a call the state is float32, so the call with a
bf16 h0 is the call with the same values in float32, o bit for bit and ht rounded once to nearest even at the end.
One small case per entry point (T = 20 over chunks of 16, two sequences), in interpret mode."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kernels_tpu.gdn import chunk_gated_delta_rule, chunk_gated_delta_rule_fwd, fused_recurrent_gated_delta_rule
from kernels_tpu.gdn2 import chunk_gdn2, fused_recurrent_gdn2
from kernels_tpu.gated_recurrent import fused_recurrent_gla, fused_recurrent_simple_gla
from kernels_tpu.gla import chunk_gla
from kernels_tpu.kda import chunk_kda, fused_recurrent_kda
from kernels_tpu.simple_gla import chunk_simple_gla, fused_chunk_simple_gla

B, T, H, K, V, C = 2, 20, 1, 16, 16, 16


def _inputs():
    rng = np.random.default_rng(80)
    n = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    return dict(q=unit(n(B, T, H, K)), k=unit(n(B, T, H, K)), v=n(B, T, H, V),
                g_head=-np.abs(n(B, T, H)) / 16, g_key=-np.abs(n(B, T, H, K)) / 16,
                beta=1 / (1 + np.exp(-n(B, T, H))), b=1 / (1 + np.exp(-n(B, T, H, K))),
                w=1 / (1 + np.exp(-n(B, T, H, V))),
                h0=n(B, H, K, V).astype(ml_dtypes.bfloat16).astype(np.float32))  # bf16- and fp16-exact values


def _calls(x):
    """(name, call(h0) -> (o, ht)) for every public forward that takes an initial state."""
    q, k, v, gh, gk, beta = x["q"], x["k"], x["v"], x["g_head"], x["g_key"], x["beta"]
    kw = dict(output_final_state=True, interpret=True)
    ck = dict(chunk_size=C, **kw)
    return [
        ("chunk_simple_gla", lambda h0: chunk_simple_gla(q, k, v, g=gh, initial_state=h0, **ck)),
        ("fused_chunk_simple_gla", lambda h0: fused_chunk_simple_gla(q, k, v, g=gh, initial_state=h0, **ck)),
        ("fused_recurrent_simple_gla", lambda h0: fused_recurrent_simple_gla(q, k, v, g=gh, initial_state=h0, **kw)),
        ("chunk_gla", lambda h0: chunk_gla(q, k, v, g=gk, initial_state=h0, **ck)),
        ("fused_recurrent_gla", lambda h0: fused_recurrent_gla(q, k, v, g=gk, initial_state=h0, **kw)),
        ("chunk_kda", lambda h0: chunk_kda(q, k, v, gk, beta, initial_state=h0, **ck)),
        ("fused_recurrent_kda", lambda h0: fused_recurrent_kda(q, k, v, gk, beta, initial_state=h0, **kw)),
        ("chunk_gated_delta_rule", lambda h0: chunk_gated_delta_rule(q, k, v, gh, beta, initial_state=h0, **ck)),
        ("chunk_gated_delta_rule_fwd",
         lambda h0: chunk_gated_delta_rule_fwd(q, k, v, gh, beta, initial_state=h0, **ck)),
        ("fused_recurrent_gated_delta_rule",
         lambda h0: fused_recurrent_gated_delta_rule(q, k, v, gh, beta, initial_state=h0, **kw)),
        ("chunk_gdn2", lambda h0: chunk_gdn2(q, k, v, gk, x["b"], x["w"], initial_state=h0, chunk_size=64, **kw)),
        ("fused_recurrent_gdn2", lambda h0: fused_recurrent_gdn2(q, k, v, gk, x["b"], x["w"], initial_state=h0, **kw)),
    ]


@pytest.mark.slow  # twelve entry points, each compiled twice in interpret mode
@pytest.mark.parametrize("cache", [ml_dtypes.bfloat16, np.float16], ids=["bf16", "fp16"])
def test_a_low_precision_state_comes_back_in_its_dtype(cache):
    x = _inputs()
    for name, call in _calls(x):
        o32, ht32 = call(x["h0"])
        o, ht = call(x["h0"].astype(cache))
        assert np.asarray(ht32).dtype == np.float32, name
        assert np.asarray(ht).dtype == np.dtype(cache), name
        np.testing.assert_array_equal(np.asarray(o).view(np.uint8), np.asarray(o32).view(np.uint8), err_msg=name)
        np.testing.assert_array_equal(np.asarray(ht).view(np.uint8), np.asarray(ht32).astype(cache).view(np.uint8),
                                      err_msg=name)
