"""benchmarks/cpu_legs.py's cost model and limit on hand-computed values: the matrix-product FLOPs of the chunk
algorithm per chunk and head, and the limit those FLOPs give at stated GEMM rates."""

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("cpu_legs", ROOT / "benchmarks" / "cpu_legs.py")
cpu_legs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cpu_legs)


def test_delta_rule_flops_by_hand():
    # C = 2, K = V = 1, forward multiply-adds: scores 3*C^2*K = 12, 2*C^2*V = 8, 3*C*K*V = 6, C^3/3 = 8/3;
    # forward + backward = 4 x forward, 2 FLOP each
    flops = cpu_legs.chunk_flops("kda", 2, 1, 1)
    assert flops == {"CKxKC": 96, "CCxCV": 64, "CKxKV": 48, "solve": pytest.approx(64 / 3)}
    assert cpu_legs.chunk_flops("gdn", 2, 1, 1) == flops == cpu_legs.chunk_flops("gdn2", 2, 1, 1)


def test_linear_recurrence_flops_by_hand():
    # C = 2, K = V = 1: C^2*K = 4, C^2*V = 4, 2*C*K*V = 4 multiply-adds; 3 x forward, 2 FLOP each
    assert cpu_legs.chunk_flops("simple_gla", 2, 1, 1) == {"CKxKC": 24, "CCxCV": 24, "CKxKV": 24, "solve": 0}
    assert cpu_legs.chunk_flops("gla", 2, 1, 1) == cpu_legs.chunk_flops("simple_gla", 2, 1, 1)


def test_the_issues_under_one_mflop_per_token_head():
    # K = V = 128, C = 64: 0.73 MFLOP per token-head for a delta rule, forward and backward
    per_token = sum(cpu_legs.chunk_flops("gdn", 64, 128, 128).values()) / 64
    assert per_token == pytest.approx(731_818.7, rel=1e-6)


def test_limit_is_flops_over_the_rate_of_their_shape_class():
    case = SimpleNamespace(B=1, T=4, H=1, HV=None, K=1, V=1, chunk_size=2)  # 2 chunks of one head
    rates = {"CKxKC": 1.0, "CCxCV": 2.0, "CKxKV": 4.0, "solve": 2.0}
    # per chunk: 24/1 + 24/2 + 24/4 + 0 = 42 s; two chunks
    assert cpu_legs.limit_seconds("simple_gla", case, rates) == pytest.approx(84.0)


def test_the_tpu_leg_it_times_is_the_legs_default_grid():
    """``tpu`` is the leg as a user runs it: until 2026-11-29 the benchmark passed ``batched_grid=None``, which the
    leg reads as False, so its "default" rows were the per-program walk (75x the limit instead of about 24x)."""
    from harness.legs.tpu import TpuLeg

    assert cpu_legs._tpu_leg("tpu").batched_grid == TpuLeg(force_interpret=True, compile_targets=()).batched_grid
    assert cpu_legs._tpu_leg("tpu-batched").batched_grid is True
    assert cpu_legs._tpu_leg("tpu-per-program").batched_grid is False
