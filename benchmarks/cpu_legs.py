"""What the legs that run on a CPU cost per token-head, beside the float64 limit measured in the same run.

For each op (simple_gla, gdn, kda: chunk, forward + backward, bf16, K = V = 128, C = 64, h0 and dht) and shape
(``B1-T2048-H4``, ``B4-T4096-H8``), in one process, on the case's draw-0 inputs:

- ``ref-golden``: the float64 chunk reference forward and backward, as the reference cache computes a golden
  (``ReferenceCache._compute``, no cache);
- ``ref-check``: the reference leg's run (``RefLeg("recurrent")``: the token-by-token formulation, checked
  against the golden by the gate);
- ``ref``: both, one after the other: what a user waits for from the reference;
- ``tpu``: the TPU leg's run as it runs by default (``TpuLeg``, no real-TPU compile): Pallas TPU interpret mode
  with the MXU model, every interpret-mode pallas_call by the batched grid interpreter
  (``harness.emulation.pallas_batched``);
- ``tpu-per-program``: the same leg with ``batched_grid=False`` (jax's per-program interpret mode);
- ``tpu-batched``: the same leg with ``batched_grid=True``, its tensors checked bit for bit against
  ``tpu-per-program``'s (``note``);
- ``gpu``: fla's chunk kernels under the GPU leg's emulation (batched grid), when fla is installed.

Each leg runs twice; ``first_s`` includes compiles, ``cost_us`` is the second run's wall time per token-head.

**The limit.** The float64 GEMM rate is measured in the same run at the case's block shapes, batched over B*H
(``[C,K]x[K,V]``, ``[C,K]x[K,C]``, ``[C,C]x[C,V]``, each jitted at ``Precision.HIGHEST``). The cost model counts
the matrix products of the chunk algorithm (2 FLOP per multiply-add, masked triangles counted in full, exps not
counted), per chunk of C tokens and per head:

- delta rule (gdn, kda): forward ``3 C^2 K + 2 C^2 V`` (scores k.k and q.k, w = T^-1 (beta k e^G), u and the
  intra-chunk output) ``+ 3 C K V`` (w S, q S, the state update) ``+ C^3/3`` (the triangular inverse);
- simple_gla: forward ``C^2 K + C^2 V + 2 C K V``;
- forward + backward = 4 x forward for the delta rule (the backward recomputes each chunk's forward under
  ``jax.checkpoint`` and costs two products per product), 3 x for simple_gla (nothing recomputed).

``limit_us`` = the case's FLOPs / the rates of their shape classes, per token-head; ``x_limit`` = cost / limit.
The recurrent check's products are matrix-vector (memory bound): its ``x_limit`` is given against the same
chunk FLOPs, as what the user waits for beyond the golden.

    .venv/bin/python benchmarks/cpu_legs.py --out reports/bench/2026-11-28-default-grid \\
        --ops simple_gla,gdn,kda --shapes B1-T2048-H4 --legs ref-golden,ref-check,ref,tpu-per-program,tpu

A benchmark, not a timed test: the numbers depend on the machine and its load (recorded beside them).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v6e-4")
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")

import numpy as np  # noqa: E402

from harness.core.provenance import git_commit  # noqa: E402

C, K, V = 64, 128, 128
GATES = {"simple_gla": "g=logsigmoid/16", "gdn": "g=logsigmoid/16", "kda": "g=logsigmoid/16"}
LEGS = ("ref-golden", "ref-check", "ref", "tpu", "tpu-per-program", "tpu-batched", "gpu")


def case_id(op: str, shape: str) -> str:
    return f"{op}.chunk/{shape}-K{K}-V{V}/bf16/{GATES[op]}/C{C}/h0,dht"


# ------------------------------------------------------------------ the cost model
FAMILY = {"simple_gla": "linear", "gla": "linear", "gdn": "delta", "kda": "delta", "gdn2": "delta"}
"""Which cost model an op's chunk form has: a gated linear recurrence or a delta rule."""


def chunk_flops(op: str, C: int, K: int, V: int) -> dict[str, float]:
    """Forward + backward FLOPs per chunk and head, by GEMM shape class (see the module doc)."""
    if FAMILY[op] == "linear":
        fwd = {"CKxKC": C * C * K, "CCxCV": C * C * V, "CKxKV": 2 * C * K * V, "solve": 0}
        times = 3
    else:
        fwd = {"CKxKC": 3 * C * C * K, "CCxCV": 2 * C * C * V, "CKxKV": 3 * C * K * V, "solve": C ** 3 / 3}
        times = 4
    return {cls: 2 * macs * times for cls, macs in fwd.items()}


def gemm_rates(batch: int, C: int, K: int, V: int, rounds: int = 5, at_least_s: float = 0.1) -> dict[str, float]:
    """float64 FLOP/s of each block shape class, batched over ``batch`` heads, in this process: the best of
    ``rounds`` rounds, each repeating the product for at least ``at_least_s`` (the machine's rate, not its
    dispatch or its neighbours)."""
    import jax
    import jax.numpy as jnp

    from references._x64 import float64_cpu

    shapes = {"CKxKC": (C, K, C), "CCxCV": (C, C, V), "CKxKV": (C, K, V)}  # the case's block shapes
    rates = {}
    with float64_cpu():
        f = jax.jit(lambda a, b: jnp.matmul(a, b, precision="highest"))
        rng = np.random.default_rng(0)
        for cls, (m, k, n) in shapes.items():
            a, b = jnp.asarray(rng.standard_normal((batch, m, k))), jnp.asarray(rng.standard_normal((batch, k, n)))
            f(a, b).block_until_ready()
            best = 0.0
            for _ in range(rounds):
                t0, n_done = time.perf_counter(), 0
                while n_done == 0 or time.perf_counter() - t0 < at_least_s:
                    f(a, b).block_until_ready()
                    n_done += 1
                best = max(best, 2 * batch * m * k * n * n_done / (time.perf_counter() - t0))
            rates[cls] = best
    rates["solve"] = rates["CCxCV"]
    return rates


def limit_seconds(op: str, case, rates: dict[str, float]) -> float:
    """The case's FLOPs at ``rates`` (FLOP/s per shape class): seconds per chunk and head, times the chunks."""
    per_chunk = chunk_flops(op, case.chunk_size, case.K, case.V)
    token_heads = case.B * case.T * (case.HV or case.H)
    return sum(flops / rates[cls] for cls, flops in per_chunk.items()) * token_heads / case.chunk_size


# ------------------------------------------------------------------ the legs
def leg_runner(name: str, op, case, inputs):
    """A zero-argument callable running leg ``name`` on the case; returns the tensors it made (or None)."""
    if name == "ref-golden":
        from harness.run.reference_cache import ReferenceCache

        return lambda: ReferenceCache(None)._compute(op, case, inputs)
    if name == "ref-check":
        from harness.legs.ref import RefLeg

        return lambda: RefLeg("recurrent").run(op, case, inputs).tensors
    if name == "ref":
        golden, check = leg_runner("ref-golden", op, case, inputs), leg_runner("ref-check", op, case, inputs)
        return lambda: (golden(), check())[1]
    if name in TPU_LEGS:
        leg = _tpu_leg(name)
        return lambda: leg.run(op, case, inputs).tensors
    if name == "gpu":
        from harness.legs.gpu import GpuLeg

        leg = GpuLeg()
        return lambda: leg.run(op, case, inputs).tensors
    raise ValueError(f"unknown leg {name!r}; choose from {LEGS}")


TPU_LEGS = ("tpu", "tpu-per-program", "tpu-batched")


def _tpu_leg(name: str):
    """The TPU leg as it runs by default (``tpu``), or with its grid option set: ``tpu-per-program``,
    ``tpu-batched``."""
    from harness.legs.tpu import TpuLeg

    grid = {"tpu": {}, "tpu-per-program": dict(batched_grid=False), "tpu-batched": dict(batched_grid=True)}[name]
    return TpuLeg(force_interpret=True, compile_targets=(), **grid)  # "tpu": the leg's own default, not a keyword


def mode(leg: str) -> str:
    """How the leg ran here: the reference natively on the CPU; the TPU and GPU legs emulated (interpreters on the
    CPU: no number of theirs is a hardware number)."""
    if leg.startswith("ref"):
        return "native (float64 on the CPU)"
    if leg == "gpu":
        from harness.legs.gpu import GpuLeg

        env = GpuLeg().environment()
        return f"{env.mode} ({env.device})"
    return "emulated (Pallas TPU interpret mode on the CPU)"


def refused(leg: str, op, case) -> str | None:
    """Why the reference leg would not run the case (it has refused cases for their size before 2026-11-28)."""
    if leg not in ("ref-check", "ref"):
        return None
    from harness.legs.ref import RefLeg

    return RefLeg("recurrent").supports(op, case)


def smoke_cold(out: Path, suite: str = "smoke") -> list[dict]:
    """The README's ``parity all --suite smoke`` from nothing cached (a fresh ``PARITY_CACHE_DIR``, a fresh result
    folder), in a process of its own; each stage's wall time is the time between the result files' last writes
    (``ref.csv``, ``gpu.csv``, ``tpu.csv``, ``causality-gpu.csv``, ``causality-tpu.csv``, ``parity.csv``), in the
    order ``parity all`` writes them. Returns one row per stage and one for the whole command."""
    import subprocess
    import tempfile

    rows = []
    with tempfile.TemporaryDirectory(prefix="parity-cold-") as tmp:
        runs = Path(tmp) / "runs"
        env = {**os.environ, "PARITY_CACHE_DIR": str(Path(tmp) / "cache"), "PYTHONPATH": str(ROOT)}
        t0 = time.time()
        done = subprocess.run([sys.executable, "-m", "harness.cli", "all", "--suite", suite, "--out", str(runs),
                               "--no-progress"], cwd=ROOT, env=env, capture_output=True, text=True)
        total = time.time() - t0
        (out / f"{suite}_cold.log").write_text(done.stdout[-20000:] + done.stderr[-20000:])
        written = sorted((p.stat().st_mtime, p.name) for p in runs.glob("*.csv"))
        last = t0
        for mtime, name in written:
            rows.append(dict(stage=name, wall_s=round(mtime - last, 1)))
            last = mtime
        rows.append(dict(stage=f"parity all --suite {suite} (exit {done.returncode})", wall_s=round(total, 1)))
    return rows


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ops", default="simple_gla,gdn,kda")
    p.add_argument("--shapes", default="B1-T2048-H4,B4-T4096-H8")
    p.add_argument("--legs", default="ref-golden,ref-check,ref,tpu-per-program,tpu")
    p.add_argument("--case", action="append", default=[], metavar="ID",
                   help="time this case instead of the ops x shapes grid (repeatable): any chunk case id")
    p.add_argument("--skip", action="append", default=[], metavar="LEG@SHAPE",
                   help="leave out a leg at a shape (repeatable), e.g. tpu@B4-T4096-H8")
    p.add_argument("--smoke-cold", action="store_true",
                   help="also time the README's parity all --suite smoke from nothing cached, by stage "
                        "(smoke_cold.csv)")
    args = p.parse_args()
    legs = args.legs.split(",")
    for leg in legs:
        if leg not in LEGS:
            p.error(f"unknown leg {leg!r}; choose from {LEGS}")

    import pandas as pd

    from cases.inputs import make_inputs
    from harness.app.selection import case_from_id
    from harness.ops import get_op

    args.out.mkdir(parents=True, exist_ok=True)
    commit = git_commit()  # the code this run imported
    rows, path = [], args.out / "cpu_legs.csv"
    ids = args.case or [case_id(o, s) for s in args.shapes.split(",") if s for o in args.ops.split(",") if o]
    for cid in ids:
            case = case_from_id(cid)
            op = get_op(case.op)
            op_name, shape = case.op.split(".")[0], cid.split("/")[1]
            inputs = make_inputs(case, op.inputs(case))
            token_heads = case.B * case.T * (case.HV or case.H)
            rates = gemm_rates(case.B * (case.HV or case.H), case.chunk_size, case.K, case.V)
            limit = limit_seconds(op_name, case, rates)
            made = {}
            for leg in legs:
                if f"{leg}@{shape}" in args.skip:
                    continue
                refusal = refused(leg, op, case)
                if refusal:
                    rows.append(dict(op=op_name, shape=shape, leg=leg, mode=mode(leg), input_sha256=inputs.sha256,
                                     token_heads=token_heads, note=refusal))
                    print(rows[-1], flush=True)
                    pd.DataFrame(rows).to_csv(path, index=False)
                    continue
                run = leg_runner(leg, op, case, inputs)
                _, first = timed(run)
                tensors, second = timed(run)
                note = ""
                if leg in ("tpu", "tpu-batched") and "tpu-per-program" in made:  # against jax's own interpreter
                    base = made["tpu-per-program"]
                    differ = [n for n in base if not np.array_equal(base[n], tensors.get(n), equal_nan=True)]
                    note = "bit for bit with tpu-per-program" if not differ else f"differs on {differ}"
                made[leg] = tensors
                row = dict(op=op_name, shape=shape, leg=leg, mode=mode(leg), input_sha256=inputs.sha256,
                           token_heads=token_heads, first_s=round(first, 2),
                           second_s=round(second, 3), cost_us=round(1e6 * second / token_heads, 2),
                           limit_us=round(1e6 * limit / token_heads, 2), x_limit=round(second / limit, 2),
                           gflops_CKxKV=round(rates["CKxKV"] / 1e9, 1), gflops_CKxKC=round(rates["CKxKC"] / 1e9, 1),
                           gflops_CCxCV=round(rates["CCxCV"] / 1e9, 1), note=note)
                rows.append(row)
                print(row, flush=True)
                pd.DataFrame(rows).to_csv(path, index=False)
    if args.smoke_cold:
        stages = smoke_cold(args.out)
        print(stages, flush=True)
        pd.DataFrame(stages).to_csv(args.out / "smoke_cold.csv", index=False)
    with open(args.out / "machine.txt", "w") as f:
        f.write(f"date {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}\n"
                f"commit {commit}\nmachine {platform.processor() or platform.machine()}, "
                f"{os.cpu_count()} cores\nload average after the run {os.getloadavg()}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
