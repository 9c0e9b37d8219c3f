"""What rounding the decode state's write once costs on a TPU, read in libtpu's final bundles (no TPU needed).

For each target (v5e, v6e, v7x), the fused-recurrent KDA kernel (``kernels_tpu.kda.recurrent``) is compiled
deviceless, with libtpu dumping its LLO (``--xla_jf_dump_to``, ``--xla_jf_dump_llo_text``), in two forms:

- ``shipped``: the kernel as it is: the decayed state an exact product and the write ``kernels_tpu.eft.fma`` with
  its error folded in (one rounding per state element per token), the sums of exact products
  ``kernels_tpu.eft.dot_rows``;
- ``plain``: the same kernel with, from this script's side, the decay a multiply, the write a multiply then an add
  (three roundings per element per token; fla's contracted kernel makes two) and the sums over rounded products:
  what the kernel would be without the error-free transformations.

The token loop is the innermost loop of the kernel's final bundles (``LB`` nesting ``>>``), one token per
iteration. Reported per target and form: the loop's bundles (one bundle issues per cycle, so its length is the
token's cost in cycles when nothing stalls), its f32 multiplies, adds and subtracts, and the whole kernel's static
bundles. The shape is a decode step: 8 one-token sequences, H = 2, K = V = 128, bf16.

    python benchmarks/decode_bundles.py [--targets v5e,v6e,v7x] [--csv FILE]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

KERNEL = "kda_fused_recurrent_fwd"
FORMS = ("shipped", "plain")
OPS = ("vmul.f32", "vadd.f32", "vsub.f32")


def _compile(target: str, form: str, dump: str) -> None:
    """In this process (jax not yet loaded): compile the kernel for ``target`` with its LLO dumped to ``dump``."""
    os.environ["LIBTPU_INIT_ARGS"] = f"--xla_jf_dump_to={dump} --xla_jf_dump_llo_text=true"
    import jax
    import jax.numpy as jnp

    from harness.compile.tpu_compile import compile_for
    from kernels_tpu import eft
    from kernels_tpu.kda import fused_recurrent_kda

    if form == "plain":
        eft.two_product = lambda a, b, a_parts=None, b_parts=None: (a * b, 0.0)
        eft.fma = lambda a, b, c, a_parts=None, b_parts=None, c_err=None: a * b + c
        eft.dot_rows = lambda x, y, axis, y_parts=None: jnp.sum(x * y, axis=axis, keepdims=True)
    N, H, K, V = 8, 2, 128, 128
    S = jax.ShapeDtypeStruct
    args = (S((1, N, H, K), jnp.bfloat16), S((1, N, H, K), jnp.bfloat16), S((1, N, H, V), jnp.bfloat16),
            S((1, N, H, K), jnp.float32), S((1, N, H), jnp.float32), S((N, H, K, V), jnp.float32))

    def decode(q, k, v, g, beta, h0):
        return fused_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                   cu_seqlens=tuple(range(N + 1)))

    result = compile_for(decode, args, target)
    if result.status != "ok":
        raise SystemExit(f"{target} {form}: {result.status}: {result.error}")


def count(bundles_text: str) -> dict:
    """The token loop's bundles and f32 ops (innermost ``>>`` loop body), and the kernel's static bundles."""
    bundle = re.compile(r"^\s*0x[0-9a-f]+\s+(?:[A-Z]{2})?:\s*(>*)\s*\{(.*)\}")
    rows = [(m.group(1), m.group(2)) for m in map(bundle.match, bundles_text.splitlines()) if m]
    depth = max(len(d) for d, _ in rows)
    loop = [body for d, body in rows if len(d) == depth]
    out = {"bundles": len(rows), "loop_depth": depth, "loop_bundles": len(loop)}
    for op in OPS:
        out[op] = sum(body.count(f" {op} ") for body in loop)
    return out


def measure(target: str, form: str) -> dict:
    with tempfile.TemporaryDirectory() as dump:
        subprocess.run([sys.executable, __file__, "--compile", target, form, dump], check=True,
                       env={**os.environ, "TPU_ACCELERATOR_TYPE": os.environ.get("TPU_ACCELERATOR_TYPE", "v6e-4"),
                            "TPU_WORKER_HOSTNAMES": os.environ.get("TPU_WORKER_HOSTNAMES", "localhost")})
        files = sorted(Path(dump).glob(f"*{KERNEL}*final_bundles.txt"))
        if not files:
            raise SystemExit(f"{target} {form}: libtpu dumped no final bundles for {KERNEL}")
        return {"target": target, "form": form, **count(files[-1].read_text())}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", default="v5e,v6e,v7x")
    ap.add_argument("--csv", type=Path)
    ap.add_argument("--compile", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.compile:
        _compile(*args.compile)
        return
    rows = [measure(t, f) for t in args.targets.split(",") for f in FORMS]
    fields = ["target", "form", "loop_bundles", *OPS, "bundles", "loop_depth"]
    print("| " + " | ".join(fields) + " |\n|" + "---|" * len(fields))
    for r in rows:
        print("| " + " | ".join(str(r[f]) for f in fields) + " |")
    if args.csv:
        with args.csv.open("x", newline="") as f:
            w = csv.DictWriter(f, fields)
            w.writeheader()
            w.writerows(rows)
    print(json.dumps({"commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                               text=True).stdout.strip()}))


if __name__ == "__main__":
    main()
