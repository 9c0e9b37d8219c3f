"""What simple_gla's and gla's decode kernels (``kernels_tpu.gated_recurrent``) cost on a TPU, read in libtpu's final
bundles (no TPU needed), as ``benchmarks/decode_bundles.py`` reads kda's.

For each target (v5e, v6e, v7x), gla's fused-recurrent forward and backward (``jax.vjp``) are compiled deviceless
with libtpu dumping its LLO. Reported per kernel: the bundles of its innermost loops (the forward: the token loop;
the backward: the loop recomputing a step's states and the reverse token loop, together: one token of each per
iteration), their f32 multiplies, adds and subtracts, and the kernel's static bundles. The shape is
:mod:`benchmarks.decode_bundles`'s: 8 one-token sequences, H = 2, K = V = 128, bf16.

    python benchmarks/gated_decode_bundles.py [--targets v5e,v6e,v7x]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_bundles import OPS, count  # noqa: E402

KERNELS = ("gated_fused_recurrent_fwd", "gated_fused_recurrent_bwd")


def _compile(target: str, dump: str) -> None:
    os.environ["LIBTPU_INIT_ARGS"] = f"--xla_jf_dump_to={dump} --xla_jf_dump_llo_text=true"
    import jax
    import jax.numpy as jnp

    from harness.compile.tpu_compile import compile_for
    from kernels_tpu.gated_recurrent import fused_recurrent_gla

    N, H, K, V = 8, 2, 128, 128
    S = jax.ShapeDtypeStruct
    args = (S((1, N, H, K), jnp.bfloat16), S((1, N, H, K), jnp.bfloat16), S((1, N, H, V), jnp.bfloat16),
            S((1, N, H, K), jnp.float32), S((N, H, K, V), jnp.float32), S((1, N, H, V), jnp.bfloat16),
            S((N, H, K, V), jnp.float32))

    def decode(q, k, v, g, h0, do, dht):
        f = lambda *a: fused_recurrent_gla(*a[:3], g=a[3], initial_state=a[4], output_final_state=True,
                                           cu_seqlens=tuple(range(N + 1)))
        out, vjp = jax.vjp(f, q, k, v, g, h0)
        return out, vjp((do, dht))

    result = compile_for(decode, args, target)
    if result.status != "ok":
        raise SystemExit(f"{target}: {result.status}: {result.error}")


def measure(target: str) -> list[dict]:
    with tempfile.TemporaryDirectory() as dump:
        subprocess.run([sys.executable, __file__, "--compile", target, dump], check=True,
                       env={**os.environ, "TPU_ACCELERATOR_TYPE": os.environ.get("TPU_ACCELERATOR_TYPE", "v6e-4"),
                            "TPU_WORKER_HOSTNAMES": os.environ.get("TPU_WORKER_HOSTNAMES", "localhost")})
        rows = []
        for kernel in KERNELS:
            files = sorted(Path(dump).glob(f"*{kernel}*final_bundles.txt"))
            if not files:
                raise SystemExit(f"{target}: libtpu dumped no final bundles for {kernel}")
            rows.append({"target": target, "kernel": kernel, **count(files[-1].read_text())})
        return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", default="v5e,v6e,v7x")
    ap.add_argument("--compile", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.compile:
        _compile(*args.compile)
        return
    fields = ["target", "kernel", "loop_bundles", *OPS, "bundles", "loop_depth"]
    print("| " + " | ".join(fields) + " |\n|" + "---|" * len(fields))
    for t in args.targets.split(","):
        for r in measure(t):
            print("| " + " | ".join(str(r[f]) for f in fields) + " |", flush=True)


if __name__ == "__main__":
    main()
