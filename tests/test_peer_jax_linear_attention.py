"""jax-linear-attention 0.1.0 through its binding (``peers/jax_linear_attention.py``): Pallas Mosaic GPU kernels,
a GPU candidate against fla. Here (no GPU; Python 3.11 and jax 0.10.2, where it does not install) every case is
refused with the reason, and the refusal imports nothing of ``jla``. The mapping onto its entry point is checked
with a stand-in for ``jla.ops`` recording the call, as on a Hopper GPU; the kernels themselves run only there
(reports/peers/jax-linear-attention/README.md)."""

import sys
from pathlib import Path

import pytest

from harness.app import case_from_id
from harness.app import load_cases
from harness.legs import registry

import peers.jax_linear_attention as jla_binding

REPORT = Path(__file__).resolve().parents[1] / "reports" / "peers" / "jax-linear-attention"
GDN = "gdn.chunk/B1-T64-H2-K64-V64/bf16/g=logsigmoid/16/C64/h0,dht"
PACKED = "gdn.chunk/B1-T128-H2-K64-V64/bf16/g=logsigmoid/16/C64/lens=37+70+21"


def test_off_a_hopper_gpu_every_case_of_its_report_is_refused_with_the_reason_and_no_import():
    cases = load_cases(REPORT / "cases.toml")
    assert len(cases) >= 40 and {c.op for c in cases} == set(jla_binding.KINDS)
    for case in cases:
        why = jla_binding.IMPLEMENTATION.bindings[case.op].supports(case)
        assert why.startswith("jax-linear-attention's kernels are Pallas Mosaic GPU kernels for an sm_90 (Hopper) "
                              "GPU and jax's default backend here is 'cpu'"), why
        assert "impl='auto' would run plain JAX here" in why
    assert "jla" not in sys.modules  # the refusal needs no import of the library (it does not install here)


def test_the_candidate_leg_takes_it_as_a_gpu_implementation():
    leg = registry.make_leg("jax-linear-attention")
    assert leg.gpu_only and not leg.native and leg.compile_targets == ()
    assert "not installed" in leg.environment().versions["jax-linear-attention"]


class _Jla:
    """A stand-in for ``jla.ops``: records the call; raises like its kernels' checks when told to."""

    __file__ = str(Path(__file__))  # its "package": a ValueError raised on a raise line here is its own check

    def __init__(self, refuse=None):
        self.calls, self.refuse = [], refuse

    def linear_attention(self, kind, q, k, v, *, impl="auto", **inputs):
        self.calls.append((kind, impl, inputs))
        if self.refuse:
            raise ValueError(self.refuse)
        return v, inputs.get("initial_state")


@pytest.fixture
def on_hopper(monkeypatch):
    """As on an H100 with it installed: the machine check passes and the library is the stand-in."""
    lib = _Jla()
    monkeypatch.setattr(jla_binding, "off_hopper", lambda: None)
    monkeypatch.setattr(jla_binding, "IMPORT_ERROR", None)
    monkeypatch.setattr(jla_binding, "_LIB", lib)
    return lib


@pytest.mark.parametrize("case, reason", [
    ("gdn.fused_recurrent/B2-T1-H2-K128-V128/bf16/g=logsigmoid/16/C64/h0", "it has no decode kernel"),
    (GDN + ",use_gate_in_kernel=1", "it has no A_log/dt_bias gate"),
    (GDN + ",use_beta_sigmoid_in_kernel=1", "beta is taken as given"),
    (PACKED + ",h0", "segment_ids"),
])
def test_what_does_not_map_is_refused_with_its_reason(on_hopper, case, reason):
    why = jla_binding.supports(case_from_id(case))
    assert why and reason in why, why


def test_the_mosaic_gpu_implementation_is_named_never_auto(on_hopper):
    import jax.numpy as jnp
    import numpy as np

    case = case_from_id(PACKED + ",noht,use_qk_l2norm_in_kernel=1")
    assert jla_binding.supports(case) is None
    a = {n: jnp.zeros((1, 128, 2, 64)) for n in ("q", "k", "v")} | {n: jnp.zeros((1, 128, 2)) for n in ("g", "beta")}
    jla_binding.forward(case, a, None)
    [(kind, impl, inputs)] = on_hopper.calls
    assert (kind, impl) == ("gated_deltanet", "mosaic_gpu") and inputs["use_qk_l2norm"] is True
    assert set(inputs) >= {"g", "beta", "scale", "initial_state", "output_final_state", "segment_ids"}
    np.testing.assert_array_equal(inputs["segment_ids"], np.repeat([0, 1, 2], [37, 70, 21])[None])


def test_its_own_checks_are_refusals_in_its_words(on_hopper):
    import jax.numpy as jnp

    on_hopper.refuse = "mosaic_gpu KDA: q, k, v must be bfloat16"
    case = case_from_id("kda.chunk/B1-T64-H2-K64-V64/fp32/g=logsigmoid/16/C64")
    a = {n: jnp.zeros((1, 64, 2, 64)) for n in ("q", "k", "v", "g")} | {"beta": jnp.zeros((1, 64, 2))}
    with pytest.raises(NotImplementedError, match="jax-linear-attention refuses the case: mosaic_gpu KDA: q, k, v"):
        jla_binding.forward(case, a, None)
