"""Where the batched grid executor's time goes: per launch, and per kind of interpreter work.

One fla chunk forward + backward (as ``benchmarks/batched_grid.py`` runs it) with the batched grid, after a warm-up,
under cProfile: prints each launch (kernel, programs, mode, seconds) and the profile's cumulative seconds of the
builder operations that do the numpy work (dots, loads, stores, pointer arithmetic, bf16 rounding, elementwise ops),
the rest being the interpreter's Python (triton.language's semantic layer, the kernel's own Python). cProfile slows
Python more than numpy, so the shares are a lower bound on the numpy work.

    .venv/bin/python benchmarks/batched_grid_profile.py --op simple_gla --shape B1-T2048-H4
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import batched_grid as bench  # noqa: E402  (puts the repository root on sys.path, enables the interpreter)

import torch  # noqa: E402

# (label, function name, file the function is defined in): the builder's numpy work, cumulative
KINDS = [("tl.dot (float64 matmul, TF32/bf16 rounding)", "create_dot", "dots.py"),
         ("loads (address checks, gather)", "load", "batched_grid.py"),
         ("stores (address checks, undo log, scatter)", "store", "batched_grid.py"),
         ("pointer arithmetic", "batched_addptr", "batched_grid.py"),
         ("bf16 rounding", "f32_to_bf16_bits", "bits.py"),
         ("elementwise binary ops", "binary_op", "interpreter.py")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", default="simple_gla", choices=("simple_gla", "kda", "gdn"))
    ap.add_argument("--shape", default="B1-T2048-H4")
    args = ap.parse_args(argv)
    B, T, H = bench.parse_shape(args.shape)
    bench.timed(args.op, bench.make_inputs(args.op, 1, 64, 1, 128, 128, torch.bfloat16), batched=True)
    x = bench.make_inputs(args.op, B, T, H, 128, 128, torch.bfloat16)
    seconds, _, session = bench.timed(args.op, x, batched=True)
    print(f"{args.op} {args.shape}: {seconds:.2f} s batched (no profiler)\n")
    print(f"{'kernel':40s} {'programs':>8s} {'mode':>10s} {'seconds':>8s} {'share':>6s}")
    total = sum(r["seconds"] for r in session.grid_launches)
    for r in session.grid_launches:
        print(f"{r['kernel']:40s} {r['programs']:8d} {r['mode']:>10s} {r['seconds']:8.3f} {r['seconds'] / total:6.1%}")
    prof = cProfile.Profile()
    prof.enable()
    profiled, _, _ = bench.timed(args.op, x, batched=True)
    prof.disable()
    stats = pstats.Stats(prof).stats
    print(f"\nunder cProfile: {profiled:.2f} s")
    for label, name, where in KINDS:
        cum = sum(v[3] for (f, _, n), v in stats.items() if n == name and f.endswith(where))
        print(f"  {label:48s} {cum:7.3f} s {cum / profiled:6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
