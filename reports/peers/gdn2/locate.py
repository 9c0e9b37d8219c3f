"""Where the GDN-2 peers' errors sit, and what the libraries' own maths changes. README.md quotes its output.

    python reports/peers/gdn2/locate.py where CASE_ID LEG[,LEG..]   # each leg vs the float64 reference: every
                                                                   # tensor's rel-L2 per 64-token block and per head
    python reports/peers/gdn2/locate.py maths CASE_ID [SEEDS]       # the library's changed maths in float64:
                                                                   # damped WY solve, clamped decay differences
    python reports/peers/gdn2/locate.py kernels LEG [DTYPE] [TARGETS] # which kernel does not compile: each of the
                                                                   # library's pallas_calls alone, for each target
    python reports/peers/gdn2/locate.py table                       # README's table, from this folder's rows

``where`` runs each leg as ``parity run`` does (the candidate leg's interpret mode and MXU model; no TPU compile):
``gpu`` is fla, ``tpu`` this project's kernels, any registered candidate by its name; a leg must be installed in
the running environment (atomic-ops has an environment of its own: peers/atomic_ops.py).

``maths`` computes GDN-2's chunked form in float64 numpy (``model``) with the two changes gdn2-pallas makes to it
(peers/gdn2_pallas.py): the strictly lower block of the WY system scaled by ``1 - wy_eps`` before the solve
(``KernelConfig.wy_eps``, 1e-3 in every preset), and every decay difference inside a chunk clamped to [-20, 20]
before its exp; each against the exact model (``wy_eps = 0``, no clamp, which equals references.gdn2 to about
1e-15), beside fla's ε from the rows. An error the float64 model of a change reproduces is that change, not
rounding.
"""

from __future__ import annotations

import sys

import numpy as np

from harness.app.analysis import f64, golden, rel_l2 as rel, run_case

BLOCK = 64


def where(case_id: str, legs: str) -> None:
    g = golden(case_id)
    case, gold = g.case, g.tensors
    print(case.id)
    for name in legs.split(","):
        out = run_case(g, name).tensors  # a candidate: no compile for real targets here
        print(f"== {name}")
        for tensor, ref in gold.items():
            got = out.get(tensor)
            if got is None or ref is None:
                continue
            text = f"{tensor:>4}: rel_l2 {rel(got, ref):.3e}"
            if f64(ref).ndim == 4 and f64(ref).shape[1] == case.T:  # [B, T, H, *]: per token block and head
                blocks = [rel(f64(got)[:, s:s + BLOCK], f64(ref)[:, s:s + BLOCK]) for s in range(0, case.T, BLOCK)]
                text += "; per 64-token block " + " ".join(f"{b:.2e}" for b in blocks)
                text += "; per head " + " ".join(f"{h:.2e}" for h in rel(got, ref, (0, 1, 3)))
            elif f64(ref).ndim == 4:  # a state [N, H, K, V]
                text += "; per head " + " ".join(f"{h:.2e}" for h in rel(got, ref, (0, 2, 3)))
            print(text)


def model(x, scale, bt, wy_eps=0.0, clamp=None):
    """GDN-2 forward, chunked WY form, float64: (o [B,T,H,V], ht [B,H,K,V]). Within a chunk of ``bt`` tokens, G the
    inclusive cumulative log decay: A[r,s] = sum_d (b k)_r[d] k_s[d] exp(G_r[d] - G_s[d]) (s < r),
    delta = (I + (1 - wy_eps) A)^-1 (w v - (b k exp G) S0), o = scale (q exp G) S0 + scale tril(q-vs-k scores)
    delta, S = diag(exp G_last) S0 + (k exp(G_last - G))^T delta. ``clamp``: every G_r - G_s clamped to
    [-clamp, clamp] before its exp, as gdn2-pallas's score kernel does."""
    q, k, v, g, b, w = (f64(x[n]) for n in ("q", "k", "v", "g", "b", "w"))
    B, T, H, K = q.shape
    S = np.zeros((B, H, K, v.shape[-1])) if x.get("h0") is None else f64(x["h0"]).copy()
    o = np.zeros(v.shape)
    for s0 in range(0, T, bt):
        sl = slice(s0, min(T, s0 + bt))
        n = sl.stop - sl.start
        G = np.cumsum(g[:, sl], axis=1)  # [B, n, H, K]
        diff = G[:, :, None] - G[:, None, :]  # [B, r, s, H, K]
        if clamp is not None:
            diff = np.clip(diff, -clamp, clamp)
        decay = np.exp(diff)
        qs, ks, bks = q[:, sl], k[:, sl], b[:, sl] * k[:, sl]
        Aqk = scale * np.einsum("brhd,bshd,brshd->bhrs", qs, ks, decay) * np.tril(np.ones((n, n)))
        Akk = np.einsum("brhd,bshd,brshd->bhrs", bks, ks, decay) * np.tril(np.ones((n, n)), -1)
        M = np.eye(n) + (1.0 - wy_eps) * Akk  # [B, H, n, n]
        eG = np.exp(G)
        rhs = (w[:, sl] * v[:, sl]).transpose(0, 2, 1, 3) - np.einsum("brhd,bhdv->bhrv", bks * eG, S)
        delta = np.linalg.solve(M, rhs)  # [B, H, n, V]
        o[:, sl] = (scale * np.einsum("brhd,bhdv->bhrv", qs * eG, S) + Aqk @ delta).transpose(0, 2, 1, 3)
        last = G[:, -1]  # [B, H, K]
        S = np.exp(last)[..., None] * S + np.einsum("brhd,bhrv->bhdv", ks * np.exp(last[:, None] - G), delta)
    return o, S


def maths(case_id: str, seeds: str = "0,1,2") -> None:
    from harness.app import case_from_id

    base = case_from_id(case_id)
    print(base.id)
    for seed in (int(s) for s in seeds.split(",")):
        g = golden(base.replace(seed=seed))
        case, x, gold = g.case, g.inputs, g.tensors
        exact = model(x, case.resolved_scale, 256)
        line = [f"seed {seed}: exact model vs references.gdn2: o {rel(exact[0], gold['o']):.1e}, "
                f"ht {rel(exact[1], gold['ht']):.1e}"]
        for label, kw in (("wy_eps 1e-3, bt 256", dict(bt=256, wy_eps=1e-3)),
                          ("wy_eps 1e-3, bt 128", dict(bt=128, wy_eps=1e-3)),
                          ("clamp 20, bt 256", dict(bt=256, clamp=20.0)),
                          ("wy_eps 1e-3 + clamp 20, bt 256", dict(bt=256, wy_eps=1e-3, clamp=20.0))):
            o, ht = model(x, case.resolved_scale, **kw)
            line.append(f"  {label}: o {rel(o, gold['o']):.3e}, ht {rel(ht, gold['ht']):.3e}")
        print("\n".join(line))


def kernels(leg: str, dtype: str = "float16", targets: str = "v5e,v6e,v7x") -> None:
    """Compile each Pallas kernel of the leg's forward and backward alone (B1, T 256, H 1, K = V = 128, inputs in
    ``dtype``), as the candidate leg's compile does (a TPU host's runtime, the target's TPU info)."""
    import jax
    import jax.numpy as jnp

    from harness.app import case_from_id
    from harness.legs import external
    from harness.legs.registry import make_leg
    from harness.compile.tpu_compile import compile_for, kernel_equations
    from harness.ops import get_op

    impl = make_leg(leg, compile_targets=()).impl
    case = case_from_id(f"gdn2.chunk/B1-T256-H1-K128-V128/{dtype}/g=logsigmoid/16/C64/h0,dht".replace(
        "float16", "fp16").replace("bfloat16", "bf16").replace("float32", "fp32"))
    op = get_op("gdn2")
    binding = impl.bindings["gdn2"]
    from cases.inputs import input_shapes

    stand_ins = {n: jax.ShapeDtypeStruct(s, d) for n, (s, d) in input_shapes(case, op.inputs(case)).items()}

    def loss(a):
        out = binding.forward(case, a, None)
        return out["o"].astype(jnp.float32).sum() + out["ht"].sum()

    for t in targets.split(","):
        jax.clear_caches()
        with external.tpu_info_for(t), external.tpu_host(t):
            eqns = kernel_equations(jax.make_jaxpr(jax.grad(loss))(stand_ins))
            for i, e in enumerate(eqns):
                prim, params = e.primitive, dict(e.params)
                avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in e.invars]
                result = compile_for(lambda *xs, p=prim, kw=params: p.bind(*xs, **kw), tuple(avals), t)
                dtypes = sorted({str(a.dtype) for a in avals})
                print(f"{t} kernel {i} ({len(avals)} operands: {', '.join(dtypes)}): {result.status}"
                      + (f" - {result.reason}" if not result.ok else ""))


TABLE = ("gdn2-pallas", "gdn2-pallas-small", "gdn2-pallas-undamped", "atomic-ops", "atomic-ops-lean", "tpu")


def table(folder: str = "") -> None:
    """ε_candidate / ε_fla on rel-L2 per dtype and tensor, over the draws both ran: the geometric mean and the
    range; ε fla the mean. ``†``: every row an ``error`` (it did not compile for TPU), the emulated run's number."""
    import re
    from pathlib import Path

    import pandas as pd

    here = Path(folder) if folder else Path(__file__).resolve().parent
    fla = pd.read_csv(here / "gpu.csv.gz")
    fla = fla[fla.status == "ok"].set_index(["case_id", "tensor"]).rel_l2
    cells: dict = {}
    for name in TABLE:
        path = here / f"{name}.csv.gz"
        if not path.exists():
            continue
        rows = pd.read_csv(path)
        rows = rows[rows.status.isin(["ok", "error"]) & np.isfinite(rows.rel_l2)]
        for r in rows.itertuples():
            base = fla.get((r.case_id, r.tensor))
            if base is None:
                continue
            key = (r.dtype, re.sub(r",?seed=\d+", "", r.case_id), r.tensor)
            cells.setdefault(key, {"fla": {}}).setdefault(name, []).append(r.rel_l2 / base)
            cells[key].setdefault(f"{name} status", set()).add(r.status)
            cells[key]["fla"][r.case_id] = base
    names = [n for n in TABLE if any(n in c for c in cells.values())]
    print("| dtype, case | tensor | ε fla | " + " | ".join(names) + " |")
    print("|---|---|---|" + "---|" * len(names))
    for (dtype, case, tensor), c in cells.items():
        out = []
        for n in names:
            v = np.asarray(c.get(n, []))
            mark = "†" if c.get(f"{n} status") == {"error"} else ""
            out.append(f"{np.exp(np.log(v).mean()):.2f}{mark} ({v.min():.2f}–{v.max():.2f})" if len(v)
                       else "–")
        shape = case.split("/")[1]
        print(f"| {dtype} {shape} | {tensor} | {np.mean(list(c['fla'].values())):.2e} | " + " | ".join(out) + " |")


if __name__ == "__main__":
    {"where": where, "maths": maths, "kernels": kernels, "table": table}[sys.argv[1]](*sys.argv[2:])
