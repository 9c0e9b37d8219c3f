"""The batched grid executor (harness/emulation/batched_grid.py) against the interpreter's sequential loop, bit for bit.

Tiny hand-written kernels first (divergent branch, loop bound loaded per program, per-program boundary masks, shape
ops, reductions and scans, chunked groups, atomics and cross-program reads falling back), then fla through the GPU
leg: every metric of every row of one case per kernel path must be the same with ``batched_grid`` on and off. Two
small cases run by default; the rest are ``slow`` (``pytest -m slow tests/test_batched_grid.py``).
"""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

if importlib.util.find_spec("triton") is None:
    pytest.skip("the batched grid tests need triton (the gpu or cpu extra)", allow_module_level=True)
torch = pytest.importorskip("torch", reason="the batched grid tests need torch (the gpu or cpu extra)")

from harness.emulation import triton_interpreter as emu  # noqa: E402
from harness.emulation.triton_interpreter import triton_emulation  # noqa: E402

if not emu.native_cuda_available():
    emu.enable_interpreter_mode()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


def _ijit(fn):
    with triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = True
        return triton.jit(fn)


@pytest.fixture(autouse=True)
def _interp_mode(monkeypatch):
    monkeypatch.delenv("TRITON_F32_DEFAULT", raising=False)
    with triton.knobs.runtime.scope(), triton.knobs.language.scope():
        triton.knobs.runtime.interpret = True
        yield


def _bits(t):
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().copy()
    return t.numpy().view(np.uint8).copy()


def _both(launch, make, **kw):
    """Run ``launch(*tensors)`` on fresh ``make()`` tensors sequentially and batched; return both results (every
    tensor's bits) and the batched session's launch records."""
    out = {}
    for batched in (False, True):
        tensors = make()
        with triton_emulation(batched_grid=batched, **kw) as session:
            launch(*tensors)
        out[batched] = ([_bits(t) for t in tensors], session)
    for a, b in zip(out[False][0], out[True][0]):
        np.testing.assert_array_equal(a, b)
    return out[True][1].grid_launches


# ---------------------------------------------------------------- kernels


@_ijit
def _branch_and_loop(X, Y, L, N: tl.constexpr, BT: tl.constexpr):
    i = tl.program_id(0)
    n = tl.load(L + i)  # a loop bound loaded per program (varlen's chunk count)
    acc = tl.zeros([BT], dtype=tl.float32)
    for t in range(n):
        x = tl.load(X + i * N + t * BT + tl.arange(0, BT)).to(tl.float32)
        acc += x * 1.5 + x * x  # products fused into adds (ptx_arith) on bf16-rounded values
    if n > 2:  # a branch that differs between programs
        acc = acc * 2
    if n == 0:
        return
    s = tl.sum(acc, axis=0)
    tl.store(Y + i * BT + tl.arange(0, BT), (acc + s).to(Y.dtype.element_ty))


def test_divergent_branches_and_loaded_loop_bounds_split_the_group_and_keep_every_bit():

    def make():
        g = torch.Generator().manual_seed(0)
        X = torch.randn(6, 4 * 16, generator=g).to(torch.bfloat16)
        L = torch.tensor([1, 3, 0, 4, 3, 2], dtype=torch.int32)
        return X, torch.full((6, 16), 7.0, dtype=torch.bfloat16), L

    launches = _both(lambda X, Y, L: _branch_and_loop[(6, )](X, Y, L, N=64, BT=16), make)
    assert [(r["kernel"], r["mode"]) for r in launches] == [("_branch_and_loop", "split")]
    assert launches[0]["groups"] == 5  # n = 1, 3, 0, 4, 2: five groups that agree


@_ijit
def _varlen_boundary(X, Y, CU, D: tl.constexpr, BT: tl.constexpr):
    # fla's varlen pattern: a program per (chunk, sequence); a per-program boundary masks the last chunk
    i_t, i_n = tl.program_id(0), tl.program_id(1)
    bos, eos = tl.load(CU + i_n).to(tl.int64), tl.load(CU + i_n + 1).to(tl.int64)
    T = eos - bos
    o_t = i_t * BT + tl.arange(0, BT)
    m = o_t < T
    p = X + (bos + o_t)[:, None] * D + tl.arange(0, D)[None, :]
    x = tl.load(p, mask=m[:, None], other=0.0)
    c = tl.cumsum(x, axis=0)  # scan along the block's first axis
    r = tl.max(tl.trans(c), axis=0)  # reduce after a transpose
    tot = tl.sum(x)  # axis=None: per program
    j = tl.reshape(tl.join(x, c), (BT, 2 * D))
    a, b = tl.split(tl.reshape(j, (BT, D, 2)))
    y = a + b + r[:, None] + tot + tl.expand_dims(tl.sum(x, axis=1), 1)
    tl.store(Y + (bos + o_t)[:, None] * D + tl.arange(0, D)[None, :], y, mask=m[:, None])


@pytest.mark.parametrize("max_programs", [256, 2])
def test_a_per_program_boundary_and_shape_ops_match_the_sequential_loop_also_in_chunks(max_programs):
    cu = [0, 0, 37, 37, 70]  # empty sequences first and between

    def make():
        g = torch.Generator().manual_seed(1)
        return (torch.randn(70, 8, generator=g), torch.zeros(70, 8), torch.tensor(cu, dtype=torch.int64))

    launches = _both(lambda X, Y, CU: _varlen_boundary[(3, 4)](X, Y, CU, D=8, BT=16), make,
                     batched_grid_max_programs=max_programs)
    assert launches[0]["mode"] == "batched" and launches[0]["groups"] == -(-12 // max_programs)


@_ijit
def _bf16_reduce(X, Y, BT: tl.constexpr):
    i = tl.program_id(0)
    x = tl.load(X + i * BT * BT + tl.arange(0, BT)[:, None] * BT + tl.arange(0, BT)[None, :])
    s = tl.sum(x, axis=1)  # bf16 pairwise tree with rounding (bf16_arith)
    d = tl.dot(x, x.T)  # batched dot
    tl.store(Y + i * BT + tl.arange(0, BT), (s.to(tl.float32) + tl.sum(d, axis=0)).to(Y.dtype.element_ty))


def test_bf16_reductions_and_dots_match_bit_for_bit():

    def make():
        g = torch.Generator().manual_seed(2)
        return torch.randn(5 * 16 * 16, generator=g).to(torch.bfloat16), torch.zeros(5 * 16, dtype=torch.bfloat16)

    launches = _both(lambda X, Y: _bf16_reduce[(5, )](X, Y, BT=16), make)
    assert launches[0]["mode"] == "batched"


@_ijit
def _atomic(X, Y, BT: tl.constexpr):
    i = tl.program_id(0)
    tl.atomic_add(Y + tl.arange(0, BT), tl.load(X + i * BT + tl.arange(0, BT)))


def test_atomics_run_the_launch_sequentially_and_say_so():

    def make():
        g = torch.Generator().manual_seed(3)
        return torch.randn(4 * 16, generator=g), torch.zeros(16)

    launches = _both(lambda X, Y: _atomic[(4, )](X, Y, BT=16), make)
    assert launches[0]["mode"] == "sequential" and "atomic" in launches[0]["reason"]


@_ijit
def _reads_neighbour(X, Y, BT: tl.constexpr):
    # program i writes Y[i] and then reads Y[i - 1]: the sequential loop shows program i-1's store
    i = tl.program_id(0)
    o = tl.arange(0, BT)
    tl.store(Y + i * BT + o, tl.load(X + i * BT + o) * 2)
    prev = tl.load(Y + (i - 1) * BT + o, mask=(o >= 0) & (i > 0), other=0.0)
    tl.store(X + i * BT + o, prev)


def test_a_program_reading_another_programs_store_falls_back_to_the_sequential_order():

    def make():
        g = torch.Generator().manual_seed(4)
        return torch.randn(4 * 8, generator=g), torch.zeros(4 * 8)

    launches = _both(lambda X, Y: _reads_neighbour[(4, )](X, Y, BT=8), make)
    assert launches[0]["mode"] == "sequential" and "another program" in launches[0]["reason"]


@_ijit
def _stores_then_reloads_own(X, Y, BT: tl.constexpr):
    # each program reads back only what it wrote itself: batched, after a read-tracked second pass
    i = tl.program_id(0)
    o = i * BT + tl.arange(0, BT)
    tl.store(Y + o, tl.load(X + o) + 1)
    tl.store(Y + o, tl.load(Y + o) * 3)


def test_a_program_reading_its_own_store_stays_batched():

    def make():
        return torch.arange(32, dtype=torch.float32), torch.zeros(32)

    launches = _both(lambda X, Y: _stores_then_reloads_own[(4, )](X, Y, BT=8), make)
    assert launches[0]["mode"] == "batched" and launches[0].get("read_tracked")


@_ijit
def _stores_each_address_twice(X, Y, BT: tl.constexpr):
    # lanes 2j and 2j+1 of one program store to one address: the later lane's value (C order) stays, as in the C++
    # store the sequential loop uses; the batched store is numpy's index assignment, held to that order here
    i = tl.program_id(0)
    o = tl.arange(0, BT)
    tl.store(Y + i * (BT // 2) + o // 2, tl.load(X + i * BT + o))


@_ijit
def _all_store_one_block(X, Y, BT: tl.constexpr):
    # every program stores to the same block: the last program's values stay
    i = tl.program_id(0)
    o = tl.arange(0, BT)
    tl.store(Y + o, tl.load(X + i * BT + o))


@_ijit
def _neighbours_overlap(X, Y, BT: tl.constexpr):
    # program i stores Y[i*BT/2 : i*BT/2 + BT]: half of it is program i+1's too, in the same store
    i = tl.program_id(0)
    o = tl.arange(0, BT)
    tl.store(Y + i * (BT // 2) + o, tl.load(X + i * BT + o))


def test_an_address_stored_twice_by_one_program_keeps_the_later_value_batched():

    def make():
        return torch.arange(4 * 16, dtype=torch.float32), torch.zeros(4 * 8)

    launches = _both(lambda X, Y: _stores_each_address_twice[(4, )](X, Y, BT=16), make)
    assert launches[0]["mode"] == "batched"


@pytest.mark.parametrize("kernel", [_all_store_one_block, _neighbours_overlap], ids=["one block", "overlap"])
def test_two_programs_storing_one_address_fall_back_to_the_sequential_order(kernel):

    def make():
        return torch.arange(4 * 16, dtype=torch.float32), torch.zeros(4 * 16)

    launches = _both(lambda X, Y: kernel[(4, )](X, Y, BT=16), make)
    assert launches[0]["mode"] == "sequential" and "two programs" in launches[0]["reason"]


def test_the_sequential_loop_stays_reachable_and_records_nothing():

    X, Y, L = torch.ones(6, 64, dtype=torch.bfloat16), torch.zeros(6, 16, dtype=torch.bfloat16), torch.ones(
        6, dtype=torch.int32)
    with triton_emulation(batched_grid=False) as session:
        _branch_and_loop[(6, )](X, Y, L, N=64, BT=16)
    assert session.settings["batched_grid"] is False and session.grid_launches == []
    with triton_emulation() as session:
        _branch_and_loop[(6, )](X, Y, L, N=64, BT=16)
    assert session.settings["grid_launches"]["batched"] == 1


# ---------------------------------------------------------------- fla through the GPU leg

FAST = [  # about 25 s each on 2 cores
    "simple_gla.chunk/B1-T128-H2-K128-V128/bf16/g=logsigmoid/16/C64/h0,dht",
    "gdn2.chunk/B1-T70-H1-K64-V64/fp32/g=logsigmoid/16/C64/lens=0+70+0,h0,dht,allow_neg_eigval=1",
]
HEAVY = [
    "simple_gla.chunk/B1-T128-H1-K128-V128/bf16/g=logsigmoid/16/C64/lens=37+70+21,h0,dht",
    "gla.chunk/B1-T128-H1-K128-V128/bf16/g=logsigmoid/16/C64/lens=37+70+21,h0,dht",
    "gdn.chunk/B1-T128-H1-K128-V128/fp32/g=logsigmoid/16/C64/lens=37+70+21,h0,dht",
    "gdn.chunk/B1-T100-H1-HV2-K64-V64/bf16/g=logsigmoid/16/C64/h0,dht,use_beta_sigmoid_in_kernel=1,"
    "use_qk_l2norm_in_kernel=1",
    "kda.chunk/B1-T128-H1-K128-V128/bf16/g=logsigmoid/16,lb-5/C64/lens=37+70+21,h0,dht,use_beta_sigmoid_in_kernel=1,"
    "use_qk_l2norm_in_kernel=1",
    "gdn2.chunk/B1-T128-H1-K128-V128/bf16/g=logsigmoid/16/C64/h0,dht,lower_bound=-5,use_gate_in_kernel=1,"
    "use_qk_l2norm_in_kernel=1",
    "kda.fused_recurrent/B1-T64-H1-HV2-K64-V64/bf16/g=logsigmoid/16,lb-5/C64/lens=1+1+3+59,h0,"
    "use_beta_sigmoid_in_kernel=1,use_qk_l2norm_in_kernel=1",
    "gdn.fused_recurrent/B1-T16-H1-HV2-K128-V128/bf16/g=logsigmoid/16/C64/lens=0+0+16,h0,pool=7",
    "gdn2.fused_recurrent/B1-T64-H1-HV2-K64-V64/bf16/g=logsigmoid/16,lb-5/C64/lens=1+1+3+59,h0,"
    "use_qk_l2norm_in_kernel=1",
    "simple_gla.fused_recurrent/B1-T64-H1-K64-V64/bf16/g=logsigmoid/16/C64/lens=0+50+14,h0,dht",
    "gla.fused_recurrent/B1-T64-H1-K64-V64/bf16/g=logsigmoid/16/C64/h0,dht",
]
VOLATILE = {"timestamp", "wall_s", "details", "git_commit"}


def _rows(case_id, batched, reference_cache):
    from harness.app import case_from_id
    from harness.legs import make_leg
    from harness.run.runner import Runner

    leg = make_leg("gpu", batched_grid=batched)
    return Runner(leg, reference_cache).run_case(case_from_id(case_id))


def _compare(case_id):
    import json

    from harness.run.reference_cache import ReferenceCache

    refs = ReferenceCache(None)  # one reference for both runs
    seq, bat = _rows(case_id, False, refs), _rows(case_id, True, refs)
    assert [r["tensor"] for r in seq] == [r["tensor"] for r in bat]
    assert all(r["status"] == "ok" for r in bat), [(r["tensor"], r["status"], r["reason"]) for r in bat]
    for a, b in zip(seq, bat):
        assert a["input_sha256"] == b["input_sha256"]
        for k in set(a) | set(b):
            if k not in VOLATILE:
                assert str(a.get(k)) == str(b.get(k)), (case_id, a["tensor"], k, a.get(k), b.get(k))
    details = json.loads(bat[0]["details"]) if isinstance(bat[0]["details"], str) else bat[0]["details"]
    return details["emulation"]["grid_launches"]


@pytest.mark.needs_leg("gpu")
@pytest.mark.parametrize("case_id", FAST)
def test_fla_rows_are_bit_for_bit_the_sequential_loops(case_id):
    launches = _compare(case_id)
    assert launches["batched"] + launches["split"] > 0


@pytest.mark.slow  # each case runs twice, once on the sequential loop: minutes, beyond CI's heavy stage budget
@pytest.mark.needs_leg("gpu")
@pytest.mark.parametrize("case_id", HEAVY)
def test_fla_rows_are_bit_for_bit_the_sequential_loops_on_every_kernel_path(case_id):
    launches = _compare(case_id)
    assert launches["batched"] + launches["split"] > 0


@_ijit
def _token_loop(X, Y, BC: tl.constexpr, D: tl.constexpr):
    # fla's token-parallel pattern: program i_t loops from its sub-chunk's start to itself
    i_t = tl.program_id(0)
    i_ts = i_t // BC * BC
    acc = tl.zeros([D], dtype=tl.float32)
    for j in range(i_ts, i_t + 1):
        acc += tl.load(X + j * D + tl.arange(0, D)) * (j - i_ts + 1).to(tl.float32)
    tl.store(Y + i_t * D + tl.arange(0, D), acc)


def test_loops_with_equal_trip_counts_run_together_from_different_starts():

    def make():
        g = torch.Generator().manual_seed(5)
        return torch.randn(32 * 4, generator=g), torch.zeros(32 * 4)

    launches = _both(lambda X, Y: _token_loop[(32, )](X, Y, BC=8, D=4), make)
    assert launches[0]["mode"] == "split" and launches[0]["groups"] == 8  # one per trip count, not one per token


def test_the_rows_comparison_finds_one_bit_and_a_missing_row(tmp_path):
    """benchmarks/batched_grid_rows.py (the sweep of a suite's GPU rows, sequential against batched): identical files
    pass; one metric one ulp off, or a row in one file only, fails and is named."""
    import importlib.util

    import pandas as pd

    spec = importlib.util.spec_from_file_location(
        "batched_grid_rows", Path(__file__).resolve().parents[1] / "benchmarks" / "batched_grid_rows.py")
    rows = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rows)
    seq = pd.DataFrame({"case_id": ["c", "c"], "draw": [0, 0], "tensor": ["o", "ht"], "input_sha256": ["a", "a"],
                        "status": ["ok", "ok"], "rel_l2": ["0.0015625", "3e-07"], "max_abs": ["0.5", "1e-06"],
                        "details": ["{}", "{}"]})
    seq.to_csv(tmp_path / "seq.csv", index=False)
    seq.to_csv(tmp_path / "same.csv", index=False)
    assert rows.main([str(tmp_path / "seq.csv"), str(tmp_path / "same.csv"), "--name", "same", "--out", str(tmp_path)]) == 0
    assert "**2 of 2**" in (tmp_path / "rows-same.md").read_text()
    seq.assign(rel_l2=["0.0015625000000000002", "3e-07"]).to_csv(tmp_path / "off.csv", index=False)
    assert rows.main([str(tmp_path / "seq.csv"), str(tmp_path / "off.csv"), "--name", "off", "--out", str(tmp_path)]) == 1
    assert "| `c` | 0 | o | rel_l2 |" in (tmp_path / "rows-off.md").read_text()
    seq.iloc[:1].to_csv(tmp_path / "short.csv", index=False)
    assert rows.main([str(tmp_path / "seq.csv"), str(tmp_path / "short.csv"), "--name", "short", "--out",
                      str(tmp_path)]) == 1
