"""The emulated GPU leg's float32 ``tl.sum`` in the compiled layout's order (harness/emulation/reduce_order.py):
the levels read from a layout, the ordered sum on hand-computed values, the TTGIR reading, and fla's kernels."""

import dataclasses

import numpy as np
import pytest

from harness.emulation.reduce_order import (LayoutNotModelled, ReduceSite, check_ptx, expected_shuffle_rounds,
                                            ordered_sum, reduce_locations, sum_levels)

# the layout of fla's fused_recurrent_fwd_kernel's b_h [64, 64] on sm_90, num_warps 4 (its TTGIR's #blocked:
# sizePerThread [1, 4], threadsPerWarp [2, 16], warpsPerCTA [4, 1], order [1, 0]) as Triton's linear layout
BLOCKED = dict(registers=((0, 1), (0, 2), (8, 0), (16, 0), (32, 0)), lanes=((0, 4), (0, 8), (0, 16), (0, 32), (1, 0)),
               warps=((2, 0), (4, 0)))


def site(axis, shape=(64, 64), **bases):
    return ReduceSite(where=(("common/fused_recurrent.py", 131, 19), ), axis=axis, shape=shape, element="f32",
                      **{**BLOCKED, **bases})


def test_levels_are_registers_in_order_then_lanes_and_warps_from_their_highest_bit():
    # axis 0: registers move rows 8, 16, 32 (bits 3, 4, 5); lane bit 4 moves row 1 (bit 0); warps rows 2, 4
    assert sum_levels(site(0)) == (("thread", 3), ("thread", 4), ("thread", 5), ("lane", 0), ("warp", 2),
                                   ("warp", 1))
    # axis 1: registers columns 1, 2; lane bits 0-3 columns 4..32, highest lane bit first (shfl 8, 4, 2, 1)
    assert sum_levels(site(1)) == (("thread", 0), ("thread", 1), ("lane", 5), ("lane", 4), ("lane", 3),
                                   ("lane", 2))


def test_a_broadcast_basis_is_no_level_and_a_mixed_basis_is_refused():
    s = ReduceSite(where=(), axis=0, shape=(8, ), element="f32", registers=((4, ), (0, )), lanes=((1, ), (2, )),
                   warps=((0, ), ))
    assert sum_levels(s) == (("thread", 2), ("lane", 1), ("lane", 0))
    with pytest.raises(LayoutNotModelled, match="moves axis 0 by 1 and other dimensions"):
        sum_levels(ReduceSite(where=(), axis=0, shape=(2, 2), element="f32", registers=((1, 1), ), lanes=((0, 1), ),
                              warps=()))
    with pytest.raises(LayoutNotModelled, match="do not cover"):
        sum_levels(ReduceSite(where=(), axis=0, shape=(8, ), element="f32", registers=((1, ), ), lanes=((2, ), ),
                              warps=()))


def test_the_order_decides_the_float32_sum_on_hand_computed_values():
    # [2^24, 1, -2^24, 1]: adding bit 0 first pairs 2^24 + 1 (a tie at 2^24's ulp of 2: even, 2^24) and
    # -2^24 + 1 (exact), so the sum is 1; adding bit 1 first pairs 2^24 - 2^24 and 1 + 1: 2
    x = np.array([2.0**24, 1, -2.0**24, 1], np.float32)
    assert ordered_sum(x, 0, (("thread", 0), ("lane", 1))) == 1
    assert ordered_sum(x, 0, (("thread", 1), ("lane", 0))) == 2
    # along a second axis the same rule per column
    xx = np.stack([x, x[::-1]], axis=1)
    np.testing.assert_array_equal(ordered_sum(xx, 0, (("thread", 1), ("lane", 0))), [2, 2])


def test_the_first_level_within_a_thread_contracts_the_left_product():
    # (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24 is no float32 (it rounds to 1 + 2^-11); added to -(1 + 2^-11) it leaves
    # 2^-24 when the product is fused, 0 when it was rounded first
    a = np.array([1 + 2.0**-12, 1.0], np.float32)
    b = np.array([1 + 2.0**-12, -(1 + 2.0**-11)], np.float32)
    x = (a * b).astype(np.float32)  # [1 + 2^-11 (rounded), -(1 + 2^-11)]

    def fma(p, q, c):
        return (p.astype(np.float64) * q + c).astype(np.float32)

    assert ordered_sum(x, 0, (("thread", 0), )) == 0  # rounded product: the 2^-24 is lost
    assert ordered_sum(x, 0, (("thread", 0), ), product=(a, b), fma=fma) == np.float32(2.0**-24)
    # a first level across lanes (a shuffle) is not contracted
    assert ordered_sum(x, 0, (("lane", 0), ), product=(a, b), fma=fma) == 0


TTGIR = '''#loc = loc("/x/site-packages/fla/ops/common/fused_recurrent.py":32:1)
#loc1 = loc(unknown)
#loc47 = loc("/x/site-packages/fla/ops/common/fused_recurrent.py":131:19)
#loc9 = loc("/x/site-packages/triton/language/standard.py":314:12)
#loc106 = loc("b_o"(#loc47))
#loc116 = loc(callsite(#loc9 at #loc106))
module {
      %b_o_77 = "tt.reduce"(%b_o_76) <{axis = 0 : i32}> ({
      ^bb0(%b_o_78: f32 loc(callsite(#loc1 at #loc106)), %b_o_79: f32 loc(callsite(#loc1 at #loc106))):
        %b_o_85 = arith.addf %b_o_78, %b_o_79 : f32 loc(#loc116)
        tt.reduce.return %b_o_85 : f32 loc(#loc116)
      }) : (tensor<64x64xf32, #blocked>) -> tensor<64xf32, #ttg.slice<{dim = 0, parent = #blocked}>> loc(#loc116)
}
'''


def test_a_reduction_is_located_by_its_call_outside_triton():
    assert reduce_locations(TTGIR) == [(("common/fused_recurrent.py", 131, 19), )]


# fused_recurrent_fwd_kernel's b_o sum as Triton 3.9 writes its PTX for sm_90 (abridged): one lane round (mask 16),
# bar.sync, the warps' round (2, then 1), the chains of several registers interleaved
PTX = """	.file	1 "/x/site-packages/fla/ops/common/fused_recurrent.py"
	.file	3 "/x/site-packages/triton/language/standard.py"
	.loc	3 314 12, function_name $L__info_string0, inlined_at 1 131 19 // standard.py:314:12
	shfl.sync.bfly.b32 	%r219, %r218, 16, 31, -1;
	shfl.sync.bfly.b32 	%r220, %r217, 16, 31, -1;
	st.shared.v4.b32 	[%r4], {%r223, %r224, %r225, %r226};
	bar.sync 	0;
	ld.shared.v4.b32 	{%r227, %r228, %r229, %r230}, [%r5];
	shfl.sync.bfly.b32 	%r231, %r227, 2, 31, -1;
	.loc	3 314 12, function_name $L__info_string0, inlined_at 1 131 19 // standard.py:314:12
	shfl.sync.bfly.b32 	%r233, %r232, 1, 31, -1;
	shfl.sync.bfly.b32 	%r234, %r228, 2, 31, -1;
	shfl.sync.bfly.b32 	%r236, %r235, 1, 31, -1;
"""


def test_the_order_read_from_a_layout_is_held_against_the_ptx_shuffles():
    s = site(0)
    assert expected_shuffle_rounds(s) == [("lane", [16]), ("warp", [2, 1])]
    assert check_ptx([s], PTX) == ("match", [])
    # the same rounds emitted twice (an unrolled loop) agree; the warps' partials on other lanes (masks 8, 4:
    # Triton's choice) agree while the round is as long and descending; an ascending warp round does not
    assert check_ptx([s], PTX + "\tbar.sync \t0;\n" + PTX) == ("match", [])
    assert check_ptx([s], PTX.replace(", 2, 31", ", 8, 31").replace(", 1, 31", ", 4, 31")) == ("match", [])
    assert check_ptx([s], PTX.replace(", 2, 31", ", 0, 31").replace(", 1, 31", ", 2, 31").replace(
        ", 0, 31", ", 1, 31"))[0] == "mismatch"
    # the same layout claimed for axis 1 predicts shuffles 8, 4, 2, 1 in one round: the PTX says otherwise
    status, bad = check_ptx([site(1)], PTX)
    assert status == "mismatch" and "layout says [[8, 4, 2, 1]] (lane), PTX [[16], [2, 1]]" in bad[0]
    assert check_ptx([], PTX) == ("n/a", [])


# kda's chunk_bwd.py:263 sum on bf16, sm_90 (its shipped layout): b_h * b_dh [16, 16] along axis 0
KDA_BF16 = ReduceSite(where=(("kda/chunk_bwd.py", 263, 22), ), axis=0, shape=(16, 16), element="bf16",
                      registers=((1, 0), (2, 0)), lanes=((4, 0), (8, 0), (0, 1), (0, 2), (0, 4)), warps=((0, 8), ))


def test_a_16_bit_sum_adds_the_halves_of_a_word_after_the_words():
    # registers 0, 1 move rows 1, 2: the words (register bit 1, row 2) first, then the halves (register bit 0, row 1)
    assert sum_levels(KDA_BF16) == (("thread", 1), ("halves", 0), ("lane", 3), ("lane", 2))
    assert sum_levels(dataclasses.replace(KDA_BF16, element="f32")) == (("thread", 0), ("thread", 1), ("lane", 3),
                                                                          ("lane", 2))
    # chunk_o.py:273's flattened [1024] (registers move 32, 64, 128, 16): words over register bits 1-3, halves last
    flat = ReduceSite(where=(), axis=0, shape=(1024, ), element="bf16", registers=((32, ), (64, ), (128, ), (16, )),
                      lanes=((256, ), (512, ), (1, ), (2, ), (4, )), warps=((8, ), ))
    assert sum_levels(flat) == (("thread", 6), ("thread", 7), ("thread", 4), ("halves", 5), ("lane", 2),
                                ("lane", 1), ("lane", 0), ("lane", 9), ("lane", 8), ("warp", 3))
    # sm_80 adds a word's halves first (no add.bf16x2 there): the plain register order
    assert sum_levels(KDA_BF16, packed=False) == (("thread", 0), ("thread", 1), ("lane", 3), ("lane", 2))
    # register bit 0 off the axis (a word holds two sums): the plain order, no halves level
    off = dataclasses.replace(KDA_BF16, registers=((0, 1), (2, 0)), lanes=((4, 0), (8, 0), (1, 0), (0, 2), (0, 4)))
    assert sum_levels(off) == (("thread", 1), ("lane", 0), ("lane", 3), ("lane", 2))


def test_a_bf16_sum_rounds_to_bf16_at_every_level_on_hand_computed_values():
    def add_bf16(lo, hi):  # a bf16 add of bf16 values: exact in float64, one rounding (bf16 keeps 8 bits)
        s = (lo.astype(np.float64) + hi)
        e = np.floor(np.log2(np.abs(s)))
        q = 2.0**(e - 7)
        return (np.round(s / q) * q).astype(np.float32)  # ties to even: np.round is half to even

    # [2^-8, 2^-8, 1, 0] (bf16's ulp of 1 is 2^-7): bit 0 first adds the two 2^-8 (exactly 2^-7) before they meet
    # 1: 1 + 2^-7, exact; bit 1 first meets 1 + 2^-8, a tie that rounds to even (1), then 2^-8 + 0, then 1 + 2^-8
    # again: 1. In float32 both orders are exact: 1 + 2^-7
    z = np.array([2.0**-8, 2.0**-8, 1, 0], np.float32)
    assert ordered_sum(z, 0, (("thread", 0), ("halves", 1)), add=add_bf16) == 1 + 2.0**-7
    assert ordered_sum(z, 0, (("thread", 1), ("halves", 0)), add=add_bf16) == 1
    assert ordered_sum(z, 0, (("thread", 1), ("halves", 0))) == 1 + 2.0**-7


# the same sum's PTX on sm_90 (abridged): the packed words, their halves, then the lane round (masks 2, 1)
PTX_BF16 = """	.file	1 "/x/site-packages/fla/ops/kda/chunk_bwd.py"
	.file	2 "/x/site-packages/triton/language/standard.py"
	.loc	2 287 12, function_name $L__info_string0, inlined_at 2 314 12 // standard.py:287:12
	.loc	2 314 12, function_name $L__info_string0, inlined_at 1 263 22 // standard.py:314:12
	fma.rn.bf16x2 	%r359, %r322, %r324, %r358;
	mov.b32 	{_, %rs1}, %r359;
	mov.b32 	%r360, {%rs1, %rs2};
	add.bf16x2 	%r361, %r359, %r360;
	shfl.sync.bfly.b32 	%r363, %r362, 2, 31, -1;
	add.bf16 	%rs5, %rs3, %rs4;
	shfl.sync.bfly.b32 	%r365, %r364, 1, 31, -1;
"""


def test_a_16_bit_sums_packing_and_shuffles_are_held_against_the_ptx():
    assert check_ptx([KDA_BF16], PTX_BF16) == ("match", [])
    unpacked = PTX_BF16.replace("fma.rn.bf16x2", "fma.rn.bf16").replace("add.bf16x2", "add.bf16")
    status, bad = check_ptx([KDA_BF16], unpacked)
    assert status == "mismatch" and "the PTX adds no 16-bit pair there" in bad[0]
    assert check_ptx([KDA_BF16], unpacked, packed=False) == ("match", [])  # sm_80: halves first, nothing packed


@pytest.mark.needs_leg("gpu")
def test_fla_decode_kernels_sum_in_the_compiled_order_with_every_sum_matched(tmp_path, monkeypatch):
    """fla's fused_recurrent forward and backward (simple_gla fp32) under the emulation: every float32 sum found its
    site in the sm_90 compile, and the layouts were kept in the cache directory."""
    from harness.app import case_from_id
    from harness.legs import make_leg
    from harness.run.reference_cache import ReferenceCache
    from harness.run.runner import Runner

    leg = make_leg("gpu")
    leg.keep_caches_under(tmp_path)
    rows = Runner(leg, ReferenceCache(None)).run_case(case_from_id(
        "simple_gla.fused_recurrent/B1-T16-H1-K64-V64/fp32/g=logsigmoid/16/C64/h0,dht"))
    assert all(r["status"] in ("ok", "not_provided") for r in rows), [(r["tensor"], r["reason"]) for r in rows]
    import json

    details = rows[0]["details"]
    emulation = (json.loads(details) if isinstance(details, str) else details)["emulation"]
    assert emulation["reduce_order"] == "compiled layout (sm_90)"
    assert "ex2.approx.f32" in emulation["not_modelled"]  # every row says what it takes as correctly rounded
    from harness.emulation import reduce_order

    assert reduce_order._PROCESS["memory"]  # the launches' layouts were read (compiled, cached or shipped)


def test_shipped_layouts_serve_exactly_their_keys(tmp_path, monkeypatch):
    """``ship`` packs a cache directory's layouts; a key found there is served without a compile, any other key is
    not (it compiles)."""
    import gzip
    import json

    from harness.emulation import reduce_order

    s = site(0)
    (tmp_path / "abc.json.gz").write_bytes(gzip.compress(json.dumps({"kernel": "k", "target": "sm_90",
                                                                     "sites": [s.as_dict()]}).encode()))
    monkeypatch.setattr(reduce_order, "SHIPPED", tmp_path / "shipped.json.gz")
    monkeypatch.setitem(reduce_order._PROCESS, "shipped", None)
    assert reduce_order.ship(tmp_path) == 1
    order = reduce_order.ReduceOrder("sm_90", tmp_path / "empty")
    assert order._load("abc") == [s] and order._load("abd") is None
