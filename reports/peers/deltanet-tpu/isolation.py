"""deltanet-tpu 0.3.0, packed sequences: which tokens of the other sequences move when one sequence is redrawn, and
whether its ``mask_lambda_by_doc`` option stops it (reports/peers/deltanet-tpu/README.md, finding on isolation).

Three documents packed in one 128-token chunk (lens 30 + 50 + 48), GDN-2 with per-channel gates, bf16 inputs, its
default precision; the middle document's every input (and its rows of ``do``) redrawn; ``o`` and every input's
gradient (``jax.vjp`` of its ``custom_vjp``) compared on the tokens of documents 0 and 2, bit for bit. Run with
the library installed (``pip install --no-deps --ignore-requires-python deltanet-tpu==0.3.0``; its Pallas kernels
run in interpret mode off a TPU, its own choice):

    python reports/peers/deltanet-tpu/isolation.py
"""

import jax
import jax.numpy as jnp
import numpy as np
from deltanet_tpu import chunk_gdn2

LENS = (30, 50, 48)
B, H, K, V = 1, 2, 128, 128
T = sum(LENS)
CU = np.cumsum((0,) + LENS).astype(np.int32)
DOC = np.repeat(np.arange(len(LENS)), LENS)


def draw(seed):
    r = np.random.default_rng(seed)
    bf = lambda *s: jnp.asarray(r.standard_normal(s), jnp.bfloat16)  # noqa: E731
    sig = lambda *s: jnp.asarray(1 / (1 + np.exp(-r.standard_normal(s))), jnp.float32)  # noqa: E731
    k = r.standard_normal((B, T, H, K))
    return {"q": bf(B, T, H, K), "k": jnp.asarray(k / np.linalg.norm(k, axis=-1, keepdims=True), jnp.bfloat16),
            "v": bf(B, T, H, V),
            "g": jnp.asarray(-np.logaddexp(0, -r.standard_normal((B, T, H, K))) / 16, jnp.float32),
            "b": sig(B, T, H, K), "w": sig(B, T, H, V), "do": bf(B, T, H, V)}


def run(x, mask_lambda_by_doc):
    def f(q, k, v, g, b, w):
        return chunk_gdn2(q, k, v, g, b, w, cu_seqlens=CU, mask_lambda_by_doc=mask_lambda_by_doc)

    names = ("q", "k", "v", "g", "b", "w")
    o, vjp = jax.vjp(f, *(x[n] for n in names))
    grads = vjp(x["do"].astype(o.dtype))
    return {"o": np.asarray(o, np.float32), **{"d" + n: np.asarray(gr, np.float32) for n, gr in zip(names, grads)}}


def main():
    base, other = draw(0), draw(1)
    mid = DOC == 1
    moved = {n: jnp.where(mid[None, :, None, None], other[n], base[n]) for n in base}
    for mask in (False, True):
        a, b = run(base, mask), run(moved, mask)
        print(f"mask_lambda_by_doc={mask}:")
        for name in a:
            for d in (0, 2):
                rows = DOC == d
                diff = np.abs(a[name][:, rows] - b[name][:, rows])
                changed = np.nonzero(diff.reshape(diff.shape[1], -1).max(axis=1))[0]
                where = "bit-exact" if not len(changed) else (
                    f"max |diff| {diff.max():.3g} (rel {diff.max() / np.abs(a[name][:, rows]).max():.2g}), "
                    f"tokens {changed.min()}..{changed.max()} of its {rows.sum()} ({len(changed)} changed)")
                print(f"  {name:3s} document {d}: {where}")


if __name__ == "__main__":
    main()
