"""The op contract's grouped value heads (fla's GVA: v with HV = a multiple of H heads) and gdn's contract
(op_contract.check_gdn, gdn_options): hand-made shapes, the accepted cases, each rejection with its message."""

from __future__ import annotations

import re

import numpy as np
import pytest

from op_contract import (GDN_OPTIONS, KDA_OPTIONS, Dims, check_gdn, check_gla, check_kda, check_qkv, check_simple_gla,
                         gdn_options, kda_options)

B, T, H, HV, K, V = 1, 6, 2, 4, 3, 5


def z(*shape, fill=0.0, dtype=np.float32):
    return np.full(shape, fill, dtype)


def qkv(hv=HV):
    return z(B, T, H, K), z(B, T, H, K), z(B, T, hv, V)


def test_dims_value_heads_default_to_h_and_name_their_layouts():
    d = Dims(1, 6, 2, 3, 5)
    assert d.HV == 2 and d.N == 1
    assert d.shape(("B", "T", "HV", "V")) == (1, 6, 2, 5) and d.shape("BTHK") == (1, 6, 2, 3)
    assert d.name(("N", "HV", "K", "V")) == "[N,H,K,V]"  # no grouped value heads: one head count, H
    g = Dims(1, 6, 2, 3, 5, HV=4)
    assert g.shape(("HV*K",)) == (12,) and g.shape(("B", "T", "HV")) == (1, 6, 4)
    assert g.name(("B", "T", "HV", "V")) == "[B,T,HV,V]" and g.name(("HV*K",)) == "[HV*K]"
    assert g.name("BTHK") == "[B,T,H,K]"


# ------------------------------------------------------------------ check_qkv
def test_grouped_values_accepted_with_their_state_and_cotangents():
    dims = check_qkv(*qkv(), initial_state=z(B, HV, K, V), do=z(B, T, HV, V), dht=z(B, HV, K, V),
                     grouped_values=True)
    assert (dims.H, dims.HV, dims.N) == (H, HV, B)
    packed = check_qkv(*qkv(), initial_state=z(3, HV, K, V), cu_seqlens=np.array([0, 2, 3, T]), grouped_values=True)
    assert (packed.N, packed.HV) == (3, HV)
    assert check_qkv(*qkv(hv=H)).HV == H  # ungrouped calls as before


def test_grouped_values_not_taken_by_default_is_not_implemented():
    with pytest.raises(NotImplementedError, match=r"^grouped value heads are not supported: v has 4 heads, q and k 2"):
        check_qkv(*qkv())


@pytest.mark.parametrize("hv", [3, 1, 5])
def test_value_heads_not_a_multiple_of_h_name_both_numbers(hv):
    with pytest.raises(ValueError, match=rf"^grouped value heads: v's HV={hv} value heads must be a multiple of "
                                         rf"H=2, the heads of q and k .*; give v a multiple of 2 heads$"):
        check_qkv(*qkv(hv=hv), grouped_values=True)


@pytest.mark.parametrize("name, bad, message", [
    ("initial_state", z(B, H, K, V), r"^initial_state must be \[B,HV,K,V\] = \(1, 4, 3, 5\), got \(1, 2, 3, 5\)$"),
    ("dht", z(B, H, K, V), r"^dht must be \[B,HV,K,V\] = \(1, 4, 3, 5\), got \(1, 2, 3, 5\)$"),
    ("do", z(B, T, H, V), r"^do must be \[B,T,HV,V\] = \(1, 6, 4, 5\), got \(1, 6, 2, 5\)$"),
])
def test_grouped_state_and_cotangents_are_checked_at_hv(name, bad, message):
    with pytest.raises(ValueError, match=message):
        check_qkv(*qkv(), **{name: bad}, grouped_values=True)


def test_packed_grouped_state_is_named_n():
    with pytest.raises(ValueError, match=r"^initial_state must be \[N,HV,K,V\] = \(3, 4, 3, 5\), got \(1, 4, 3, 5\)$"):
        check_qkv(*qkv(), initial_state=z(1, HV, K, V), cu_seqlens=[0, 2, 3, T], grouped_values=True)


def test_ungrouped_messages_are_unchanged():
    with pytest.raises(ValueError, match=r"^initial_state must be \[B,H,K,V\] = \(1, 2, 3, 5\), got \(1, 4, 3, 5\)$"):
        check_qkv(*qkv(hv=H), initial_state=z(B, HV, K, V), grouped_values=True)
    with pytest.raises(ValueError, match=r"^need q, k \[B,T,H,K\] and v \[B,T,H,V\]"):
        check_qkv(z(B, T, H, K), z(B, T, H, K), z(B, T + 1, H, V))


def test_simple_gla_and_gla_refuse_grouped_values():
    q, k, v = qkv()
    with pytest.raises(NotImplementedError, match="grouped value heads"):
        check_simple_gla(q, k, v, g=z(B, T, H, fill=-0.1))
    with pytest.raises(NotImplementedError, match="grouped value heads"):
        check_gla(q, k, v, g=z(B, T, H, K, fill=-0.1))


# ------------------------------------------------------------------ check_kda
def kda_args(**change):
    q, k, v = qkv()
    args = dict(q=q, k=k, v=v, g=z(B, T, HV, K, fill=-0.1), beta=z(B, T, HV, fill=0.5))
    return {**args, **change}


def test_kda_takes_grouped_values():
    opts = {**KDA_OPTIONS, "use_gate_in_kernel": True}
    dims, scale = check_kda(**kda_args(g=z(B, T, HV, K, fill=2.0)), initial_state=z(B, HV, K, V), opts=opts,
                            A_log=z(HV), dt_bias=z(HV * K))
    assert dims.HV == HV and scale == K ** -0.5


@pytest.mark.parametrize("change, message", [
    (dict(g=z(B, T, H, K)), r"^g must be \[B,T,HV,K\] = \(1, 6, 4, 3\), got \(1, 6, 2, 3\)$"),
    (dict(beta=z(B, T, H)), r"^beta must be \[B,T,HV\] = \(1, 6, 4\), got \(1, 6, 2\)$"),
    (dict(A_log=z(H)), r"^A_log must be \[HV\] = \(4,\), got \(2,\)$"),
    (dict(dt_bias=z(H * K)), r"^dt_bias must be \[HV\*K\] = \(12,\), got \(6,\)$"),
    (dict(dt_bias=z(HV * K).astype(np.int32)), r"^dt_bias must be floating point"),
])
def test_kda_grouped_rejections(change, message):
    gate = dict(opts={**KDA_OPTIONS, "use_gate_in_kernel": True}, A_log=z(HV), dt_bias=z(HV * K))
    args = kda_args(**{n: x for n, x in change.items() if n in ("g", "beta")})
    gate.update({n: x for n, x in change.items() if n in ("A_log", "dt_bias")})
    with pytest.raises(ValueError, match=message):
        check_kda(**args, **gate)


def test_kda_ungrouped_dt_bias_message_is_unchanged():
    q, k, v = qkv(hv=H)
    with pytest.raises(ValueError, match=r"^dt_bias must be \[H\*K\] = \(6,\), got \(12,\)$"):
        check_kda(q, k, v, z(B, T, H, K), z(B, T, H), opts={**KDA_OPTIONS, "use_gate_in_kernel": True},
                  A_log=z(H), dt_bias=z(HV * K))


def test_kda_bad_value_heads():
    with pytest.raises(ValueError, match=r"HV=3 value heads must be a multiple of H=2"):
        check_kda(*qkv(hv=3), z(B, T, 3, K), z(B, T, 3))


# ------------------------------------------------------------------ check_gdn
def gdn_args(**change):
    q, k, v = qkv()
    return {**dict(q=q, k=k, v=v, g=z(B, T, HV, fill=-0.1), beta=z(B, T, HV, fill=0.5)), **change}


def test_gdn_options_fill_in_fla_defaults_and_refuse_unknown_names():
    assert GDN_OPTIONS == dict(use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                               use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False)
    assert gdn_options({"use_gate_in_kernel": True}) == {**GDN_OPTIONS, "use_gate_in_kernel": True}
    with pytest.raises(TypeError, match=re.escape("chunk_gated_delta_rule got unknown options ['lower_bound']")):
        gdn_options({"lower_bound": -1.0})
    with pytest.raises(TypeError, match=re.escape("chunk_kda got unknown options ['nope']")):
        kda_options({"nope": 1})
    with pytest.raises(TypeError, match="unknown options"):
        check_gdn(**gdn_args(), opts={"safe_gate": True})


def test_gdn_accepts_grouped_values_packed_and_its_in_kernel_gate():
    dims, scale = check_gdn(**gdn_args(), initial_state=z(B, HV, K, V), do=z(B, T, HV, V), dht=z(B, HV, K, V),
                            scale=0.5)
    assert (dims.H, dims.HV, scale) == (H, HV, 0.5)
    dims, _ = check_gdn(**gdn_args(), initial_state=z(2, HV, K, V), cu_seqlens=np.array([0, 4, T]))
    assert dims.N == 2
    # the raw gate input may be positive; dt_bias is optional
    opts = {**GDN_OPTIONS, "use_gate_in_kernel": True}
    check_gdn(**gdn_args(g=z(B, T, HV, fill=3.0)), opts=opts, A_log=z(HV))
    check_gdn(**gdn_args(g=z(B, T, HV, fill=3.0)), opts=opts, A_log=z(HV), dt_bias=z(HV))
    check_gdn(**gdn_args(), opts={**GDN_OPTIONS, "use_beta_sigmoid_in_kernel": True, "allow_neg_eigval": True})
    # A_log and dt_bias are ignored without the in-kernel gate, as in fla
    check_gdn(**gdn_args(), A_log=z(7), dt_bias=z(7))


GATE = {**GDN_OPTIONS, "use_gate_in_kernel": True}


@pytest.mark.parametrize("change, kw, message", [
    (dict(g=z(B, T, H)), {}, r"^g must be \[B,T,HV\] = \(1, 6, 4\), got \(1, 6, 2\)$"),
    (dict(g=z(B, T, HV, K)), {}, r"^g must be \[B,T,HV\] = \(1, 6, 4\), got \(1, 6, 4, 3\)$"),
    (dict(g=None), {}, r"^g must be \[B,T,HV\] = \(1, 6, 4\), got NoneType$"),
    (dict(beta=z(B, T, H)), {}, r"^beta must be \[B,T,HV\] = \(1, 6, 4\), got \(1, 6, 2\)$"),
    (dict(g=z(B, T, HV, fill=0.25)), {}, r"^g is a log decay and must be <= 0 .* got max\(g\) = 0\.25;"),
    (dict(g=z(B, T, HV).astype(np.int32)), {}, r"^g must be floating point, got g.dtype=int32"),
    ({}, dict(opts=GATE), r"^A_log must be given when use_gate_in_kernel=True$"),
    ({}, dict(opts=GATE, A_log=z(H)), r"^A_log must be \[HV\] = \(4,\), got \(2,\)$"),
    ({}, dict(opts=GATE, A_log=z(HV), dt_bias=z(HV * K)), r"^dt_bias must be \[HV\] = \(4,\), got \(12,\)$"),
    ({}, dict(opts={**GDN_OPTIONS, "allow_neg_eigval": True}),
     r"^allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True"),
    ({}, dict(initial_state=z(B, H, K, V)), r"^initial_state must be \[B,HV,K,V\] = \(1, 4, 3, 5\)"),
    ({}, dict(chunk_size=0), r"^chunk_size=0 must be a positive int$"),
    ({}, dict(scale=0.0), r"^scale must be None or a finite non-zero"),
    (dict(v=z(B, T, 6, V), g=z(B, T, 6), beta=z(B, T, 6)), {},
     r"^grouped value heads: v's HV=6 value heads must be a multiple of H=4"),
])
def test_gdn_rejections(change, kw, message):
    args = gdn_args(**change)
    if "v" in change:  # H = 4 q/k heads, HV = 6
        args.update(q=z(B, T, 4, K), k=z(B, T, 4, K))
    with pytest.raises(ValueError, match=message):
        check_gdn(**args, **kw)


def test_gdn_ungrouped_messages_name_h():
    q, k, v = qkv(hv=H)
    with pytest.raises(ValueError, match=r"^beta must be \[B,T,H\] = \(1, 6, 2\), got \(1, 6, 4\)$"):
        check_gdn(q, k, v, z(B, T, H), z(B, T, HV))
