"""A candidate whose kernels are built for a GPU (``platform = "gpu"`` on its object, harness.legs.external): it is
never interpreted, modeled or compiled as a TPU kernel. Off a GPU every case is refused with the reason; where jax
has a GPU it runs natively, as it is (here a pure-jnp binding stands in for the GPU kernels, with the leg told a GPU
is present)."""

import numpy as np
import pytest

from harness.app import case_from_id
from harness.legs import external, registry

CASE = "simple_gla.chunk/B1-T32-H1-K64-V64/fp32/g=logsigmoid/16/C64"

PACKAGE = '''
import jax.numpy as jnp

from harness.ops.base import LegBinding


def forward(case, a, ctx):
    assert ctx.interpret is None and not ctx.mxu_model, ctx  # never interpreted, never modeled
    q, k, v, g = a["q"], a["k"], a["v"], a["g"]
    T = q.shape[1]
    cum = jnp.cumsum(g, axis=1)  # [B, T, H]
    decay = jnp.exp(cum[:, :, None, :] - cum[:, None, :, :])  # [B, t, s, H]
    mask = jnp.tril(jnp.ones((T, T), bool))[None, :, :, None]
    scores = jnp.einsum("bthk,bshk->btsh", q, k) * case.resolved_scale * jnp.where(mask, decay, 0.0)
    return {"o": jnp.einsum("btsh,bshv->bthv", scores, v), "ht": None}


class Gpu:
    version = "gpu-kernels 1.0"
    platform = "gpu"
    bindings = {"simple_gla": LegBinding(forward, differentiable=False)}


class Neither:
    version = "x 1.0"
    platform = "npu"
    bindings = {"simple_gla": LegBinding(forward)}


GPU = Gpu()
NEITHER = Neither()
'''


@pytest.fixture
def gpu_impl(tmp_path, monkeypatch):
    (tmp_path / "gpu_kernels.py").write_text(PACKAGE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_LEGS", {spec.name: spec for spec in registry.BUILTIN})
    monkeypatch.setattr(registry, "_entry_points_loaded", True)
    registry.register_implementation("gpu-kernels", "gpu_kernels:GPU")
    registry.register_implementation("npu-kernels", "gpu_kernels:NEITHER")


def _op(case):
    from harness.ops import get_op

    return get_op(case.op)


def test_off_a_gpu_every_case_is_refused_with_the_reason_and_nothing_is_compiled(gpu_impl):
    leg = registry.make_leg("gpu-kernels")
    case = case_from_id(CASE)
    assert not leg.native and leg.compile_targets == ()
    why = leg.supports(_op(case), case)
    assert why.startswith("the implementation gpu_kernels:GPU declares platform 'gpu'") and "'cpu'" in why, why
    with pytest.raises(NotImplementedError, match="declares platform 'gpu'"):
        leg.run(_op(case), case, None)
    env = leg.environment()
    assert env.settings["platform"] == external.GPU_ONLY and "compile_targets" not in env.settings
    assert env.device == "cpu (no GPU: every case refused)"


def test_on_a_gpu_it_runs_natively_with_no_interpreter_and_no_mxu_model(gpu_impl, monkeypatch):
    from cases.inputs import make_inputs

    monkeypatch.setattr(external, "gpu_available", lambda: True)
    leg = registry.make_leg("gpu-kernels")
    case = case_from_id(CASE)
    op = _op(case)
    assert leg.native and leg.compile_targets == () and leg.supports(op, case) is None
    inputs = make_inputs(case, op.inputs(case))
    assert leg.preflight(op, case, inputs) == (None, {"compiled_for": "native"})
    out = leg.run(op, case, inputs)
    assert "mxu_cost" not in out.columns and "xla_dots" not in out.details  # no MXU model, no XLA:TPU dot reading
    a = {n: np.asarray(x, np.float64) for n, x in inputs.arrays.items()}
    cum = np.cumsum(a["g"], axis=1)
    scores = (np.einsum("bthk,bshk->btsh", a["q"], a["k"]) * case.resolved_scale
              * np.where(np.tril(np.ones((32, 32), bool))[None, :, :, None],
                         np.exp(cum[:, :, None, :] - cum[:, None, :, :]), 0.0))
    expected = np.einsum("btsh,bshv->bthv", scores, a["v"])
    got = out.tensors["o"].astype(np.float64)
    # float32 as XLA:CPU computes it: far closer than one bf16 pass of the MXU model would leave it (~1e-3)
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 1e-5


def test_a_platform_it_does_not_know_is_one_line(gpu_impl):
    with pytest.raises(ValueError, match=r"implementation npu-kernels=gpu_kernels:NEITHER: platform 'npu' must be"):
        registry.make_leg("npu-kernels")


def test_its_gate_report_names_it_a_gpu_candidate_not_a_tpu_kernel(gpu_impl):
    """Off a GPU its rows are refusals; the gate's reasons and report call the sides by their legs' names (not GPU
    and TPU), say what a GPU candidate's verdict means, and claim no TPU compile."""
    import json

    from harness.judge.gate import apply_gate
    from harness.core.policy import Policy
    from harness.run.reference_cache import ReferenceCache
    from harness.report.reports import markdown
    from harness.core.results import rows_to_frame
    from harness.run.runner import Runner

    cand = rows_to_frame(Runner(registry.make_leg("gpu-kernels"), ReferenceCache(None)).run_case(case_from_id(CASE)))
    base = cand.assign(leg="gpu", settings="{}", versions=json.dumps({registry.version_key("gpu"): "a version"}))
    result = apply_gate(base, cand, Policy(), baseline_leg="gpu", candidate_leg="gpu-kernels")
    refused = result.parity[result.parity["verdict"] == "unsupported"]
    assert len(refused) and refused["reason"].str.startswith("gpu-kernels: the implementation gpu_kernels:GPU "
                                                             "declares platform 'gpu'").all()
    text = markdown(result)
    assert "**A GPU candidate** (gpu-kernels), its kernels run natively on a GPU only" in text
    assert "no case ran here: every one was refused for want of a GPU" in text
    assert "compiled for a real TPU" not in text and "compiled with libtpu" not in text
    assert "| case | tensor | metric | ε_gpu | ε_gpu-kernels | ratio | reason | repro |" in text  # the coverage row
