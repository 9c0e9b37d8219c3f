"""Measure emulated fla simple-GLA kernels against a float64 recurrence.

Usage (CPU, interpreter; one JSON line per combination on stdout):

    python -m harness.emulation.measure_simple_gla --ops chunk fused \
        --dtypes bf16 fp16 fp32 --gates g g_gamma --T 256 --H 2 --K 128 --V 128

Forward + backward (through autograd, with upstream grads on o and ht and a
trainable initial state) under :func:`triton_emulation`; rel_l2 per tensor vs
a float64 torch-autograd recurrence on the same (already rounded) inputs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

from harness.emulation import triton_interpreter as emu

if not emu.native_cuda_available():
    emu.enable_interpreter_mode()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def reference(q, k, v, g, h0, scale, do, dht):
    """float64 recurrence S_t = exp(g_t) S_{t-1} + k_t^T v_t, o_t = scale q_t S_t; [T,H,*] tensors."""
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v, g, h0)]
    qd, kd, vd, gd, hd = leaves
    S = hd
    outs = []
    for t in range(qd.shape[0]):
        S = torch.exp(gd[t])[:, None, None] * S + kd[t][:, :, None] * vd[t][:, None, :]
        outs.append(scale * torch.einsum("hk,hkv->hv", qd[t], S))
    o = torch.stack(outs)
    ((o * do.double()).sum() + (S * dht.double()).sum()).backward()
    return {"o": o.detach(), "ht": S.detach(), "dq": qd.grad, "dk": kd.grad, "dv": vd.grad, "dg": gd.grad,
            "dh0": hd.grad}


def rel_l2(x, ref):
    x, ref = x.double(), ref.double()
    return float(torch.linalg.norm(x - ref) / torch.linalg.norm(ref).clamp_min(1e-300))


def run_one(op, dtype_name, gate, T, H, K, V, seed=0, dot_precision=None):
    from fla.ops.simple_gla import chunk_simple_gla, fused_chunk_simple_gla

    fn = {"chunk": chunk_simple_gla, "fused": fused_chunk_simple_gla}[op]
    dt = DTYPES[dtype_name]
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, T, H, K, generator=gen).to(dt).requires_grad_()
    k = torch.randn(1, T, H, K, generator=gen).to(dt).requires_grad_()
    v = torch.randn(1, T, H, V, generator=gen).to(dt).requires_grad_()
    h0 = torch.randn(1, H, K, V, generator=gen).float().requires_grad_()
    do = torch.randn(1, T, H, V, generator=gen).to(dt)
    dht = torch.randn(1, H, K, V, generator=gen).float()
    scale = K**-0.5
    kw = {}
    if gate == "g":
        g = F.logsigmoid(torch.randn(1, T, H, generator=gen) + 3.0).float().requires_grad_()
        kw["g"] = g
        g_full = g[0]
    else:
        g = torch.log1p(-torch.pow(2.0, -5.0 - torch.arange(H, dtype=torch.float32))).requires_grad_()
        kw["g_gamma"] = g
        g_full = g[None, :].expand(T, H)
    row = {"op": op, "dtype": dtype_name, "gate": gate, "T": T, "H": H, "K": K, "V": V}
    t0 = time.perf_counter()
    try:
        with emu.triton_emulation(dot_precision=dot_precision) as session:
            o, ht = fn(q, k, v, scale=scale, initial_state=h0, output_final_state=True, **kw)
            t1 = time.perf_counter()
            ((o * do).sum() + (ht * dht).sum()).backward()
        t2 = time.perf_counter()
    except Exception as e:  # report, don't stop the sweep
        row.update(error=f"{type(e).__name__}: {str(e)[:300]}", trace=traceback.format_exc()[-800:])
        return row
    row.update(fwd_s=round(t1 - t0, 2), fwd_bwd_s=round(t2 - t0, 2), settings=session.settings,
               configs=session.configs_summary())
    ref = reference(q[0], k[0], v[0], g_full, h0[0], scale, do[0], dht[0])
    got = {"o": o[0], "ht": ht[0], "dq": q.grad[0], "dk": k.grad[0], "dv": v.grad[0], "dh0": h0.grad[0]}
    if gate == "g":
        got["dg"] = g.grad[0]
    else:
        ref["dg"] = ref["dg"].sum(0)  # d/d g_gamma = sum over t of d/d g_t
        got["dg"] = g.grad
    row["g_gamma_grad_returned"] = None if gate == "g" else g.grad is not None
    row["rel_l2"] = {}
    for name, r in ref.items():
        x = got.get(name)
        if x is None:
            row["rel_l2"][name] = None
            continue
        row["rel_l2"][name] = float(f"{rel_l2(x.detach(), r):.3e}")
        if not torch.isfinite(x.float()).all():
            row.setdefault("nonfinite", []).append(name)
    return row


def probe_fused_kwargs():
    """Which keyword arguments fused_chunk_simple_gla accepts (signature + one tiny call each)."""
    import inspect

    from fla.ops.simple_gla import fused_chunk_simple_gla

    params = set(inspect.signature(fused_chunk_simple_gla).parameters)
    out = {name: name in params for name in ("chunk_size", "g_gamma", "initial_state", "output_final_state")}
    q = torch.randn(1, 16, 1, 16)
    try:
        with emu.triton_emulation():
            fused_chunk_simple_gla(q, q, q, g=torch.zeros(1, 16, 1), chunk_size=16)
        out["chunk_size_call"] = "ok"
    except Exception as e:
        out["chunk_size_call"] = f"{type(e).__name__}: {str(e)[:200]}"
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", nargs="+", default=["chunk", "fused"])
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp16", "fp32"])
    ap.add_argument("--gates", nargs="+", default=["g", "g_gamma"])
    ap.add_argument("--T", type=int, default=256)
    ap.add_argument("--H", type=int, default=2)
    ap.add_argument("--K", type=int, default=128)
    ap.add_argument("--V", type=int, default=128)
    ap.add_argument("--dot-precision", default=None)
    ap.add_argument("--probe", action="store_true")
    a = ap.parse_args(argv)
    print(json.dumps({"versions": emu.triton_versions(), "cuda": emu.native_cuda_available()}), flush=True)
    if a.probe:
        print(json.dumps({"fused_kwargs": probe_fused_kwargs()}), flush=True)
    for op in a.ops:
        for dt in a.dtypes:
            for gate in a.gates:
                print(json.dumps(run_one(op, dt, gate, a.T, a.H, a.K, a.V, dot_precision=a.dot_precision)),
                      flush=True)


if __name__ == "__main__":
    sys.exit(main())
