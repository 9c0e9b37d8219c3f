"""Per-token-head cost of fla's chunk kernels under the GPU leg's emulation: sequential interpreter vs batched grid.

Runs fla's forward + backward (``torch.autograd.grad``) inside ``triton_emulation(batched_grid=False)`` (the stock
interpreter loop, one pass per program) and ``triton_emulation(batched_grid=True)`` (harness/emulation/batched_grid.py)
in one process, one after the other on the same inputs, checks that every output and gradient is bit for bit equal,
and writes one CSV row per (op, shape, mode) plus a README with the date, machine, load average and commit.

    .venv/bin/python benchmarks/batched_grid.py --out reports/bench/2026-11-26-batched-grid \\
        --ops simple_gla,kda,gdn --shapes B1-T2048-H4 [--skip-sequential-above 8192]

A benchmark, not a timed test: the numbers depend on the machine and its load (recorded beside them).
``--skip-sequential-above N`` runs only the batched executor for shapes with more than N token-heads (the sequential
loop takes minutes there); such rows say ``sequential skipped``.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")

from harness.core.provenance import git_commit  # noqa: E402
from harness.emulation import enable_interpreter_mode, triton_emulation  # noqa: E402

enable_interpreter_mode()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def parse_shape(s: str):
    parts = dict((p[0], int(p[1:])) for p in s.split("-"))
    return parts["B"], parts["T"], parts["H"]


def make_inputs(op: str, B: int, T: int, H: int, K: int, V: int, dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    x = {"q": rnd(B, T, H, K), "k": rnd(B, T, H, K), "v": rnd(B, T, H, V), "do": rnd(B, T, H, V)}
    if op == "simple_gla":
        x["g"] = F.logsigmoid(torch.randn(B, T, H, generator=g)).float() / 16
    elif op == "gdn":
        x["k"] = F.normalize(x["k"].float(), dim=-1).to(dtype)
        x["g"] = F.logsigmoid(torch.randn(B, T, H, generator=g)).float() / 16
        x["beta"] = torch.rand(B, T, H, generator=g).to(dtype)
    elif op == "kda":
        x["k"] = F.normalize(x["k"].float(), dim=-1).to(dtype)
        x["g"] = F.logsigmoid(torch.randn(B, T, H, K, generator=g)).float() / 16
        x["beta"] = torch.rand(B, T, H, generator=g).to(dtype)
    else:
        raise ValueError(op)
    return x


def run_op(op: str, x):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from fla.ops.kda import chunk_kda
    from fla.ops.simple_gla import chunk_simple_gla

    t = {k: v.clone().requires_grad_(k in ("q", "k", "v", "g", "beta")) for k, v in x.items() if k != "do"}
    if op == "simple_gla":
        o, _ = chunk_simple_gla(t["q"], t["k"], t["v"], g=t["g"])
    elif op == "gdn":
        o, _ = chunk_gated_delta_rule(t["q"], t["k"], t["v"], g=t["g"], beta=t["beta"])
    else:
        o, _ = chunk_kda(t["q"], t["k"], t["v"], g=t["g"], beta=t["beta"])
    names = [k for k in t if t[k].requires_grad]
    grads = torch.autograd.grad([o], [t[k] for k in names], [x["do"].to(o.dtype)])
    return {"o": o.detach(), **{"d" + n: gr for n, gr in zip(names, grads)}}


def timed(op, x, batched: bool):
    with triton_emulation(batched_grid=batched) as session:
        t0 = time.perf_counter()
        out = run_op(op, x)
        dt = time.perf_counter() - t0
    return dt, out, session


def bits_equal(a, b) -> bool:
    return all(torch.equal(a[k].view(torch.int16) if a[k].dtype == torch.bfloat16 else a[k],
                           b[k].view(torch.int16) if b[k].dtype == torch.bfloat16 else b[k]) and
               torch.equal(torch.isnan(a[k]), torch.isnan(b[k])) for k in a)



def write_readme(out: Path, argv) -> None:
    """README.md from results.csv: every row as measured (nothing typed in), with the machine and its load."""
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    cols = ["op", "shape", "token_heads", "mode", "seconds", "us_per_token_head", "speedup", "bits_equal",
            "launches_batched", "launches_split", "launches_sequential", "load_avg_1m_before", "commit"]
    table = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    table += ["| " + " | ".join(r.get(c, "") for c in cols) + " |" for r in rows]
    reasons = sorted({r["sequential_reasons"] for r in rows if r.get("sequential_reasons")})
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem = float("nan")
    text = [
        "# Batched grid executor: per-token-head cost against the sequential interpreter", "",
        "Written by `benchmarks/batched_grid.py` from `results.csv` (every row as measured; rerunning the script "
        "appends rows and rewrites this file). Each row: seconds of fla's forward + backward "
        "(`torch.autograd.grad` of `o` with a random `do`) inside `triton_emulation`, with the interpreter's stock "
        "sequential loop (`batched_grid=False`) and with the batched grid executor, on the same inputs in one "
        "process, after an untimed warm-up at T = 64 in both modes (kernels are rewritten once per process). "
        "`bits_equal`: every output and gradient of the batched run equals the sequential run's, bit for bit. "
        "`load_avg_1m_before`: the machine's 1-minute load average just before the timed run (the machine is "
        "shared; a load above its core count slows both modes, not necessarily alike). "
        "`launches_*`: how the batched run's kernel launches ran (harness/emulation/batched_grid.py).", "",
        f"- last written: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
        f"- machine: {platform.platform()}, {os.cpu_count()} CPUs, {mem:.0f} GiB, python "
        f"{platform.python_version()}, torch {torch.__version__}",
        f"- last command: `benchmarks/batched_grid.py {' '.join(argv if argv is not None else sys.argv[1:])}`", "",
        *table, "",
    ]
    if reasons:
        text += ["Launches that ran sequentially: " + "; ".join(reasons), ""]
    census = out / "launches.csv"
    if census.exists():  # written by benchmarks/batched_grid_launches.py
        with census.open() as f:
            launches = list(csv.DictReader(f))
        modes: dict = {}
        for r in launches:
            modes[r["mode"]] = modes.get(r["mode"], 0) + 1
        split = sorted({r["kernel"] for r in launches if r["mode"] == "split"})
        text += [f"`launches.csv` (`benchmarks/batched_grid_launches.py`, the cases of `tests/test_batched_grid.py`): "
                 f"{len(launches)} launches of {len({r['case'] for r in launches})} GPU-leg cases, by mode "
                 f"{dict(sorted(modes.items()))}; kernels that split: {', '.join(split) or 'none'}.", ""]
    (out / "README.md").write_text("\n".join(text))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for results.csv and README.md")
    ap.add_argument("--ops", default="simple_gla", help="comma list of simple_gla, kda, gdn")
    ap.add_argument("--shapes", default="B1-T2048-H4", help="comma list of B?-T?-H?")
    ap.add_argument("--K", type=int, default=128)
    ap.add_argument("--V", type=int, default=128)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    ap.add_argument("--skip-sequential-above", type=int, default=None, metavar="N",
                    help="token-heads above which the sequential loop is not run (its time: minutes to hours)")
    args = ap.parse_args(argv)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "results.csv"
    fields = ["op", "shape", "dtype", "K", "V", "token_heads", "mode", "seconds", "us_per_token_head", "speedup",
              "bits_equal", "launches_batched", "launches_split", "launches_sequential", "sequential_reasons",
              "load_avg_1m_before", "commit"]
    new = not csv_path.exists()
    commit = git_commit() or "unknown"
    with csv_path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        if new:
            w.writeheader()
        for op in args.ops.split(","):
            # warm-up at a tiny shape, both modes: kernels are rewritten (AST) once per process, not timed
            for batched in (False, True):
                timed(op, make_inputs(op, 1, 64, 1, args.K, args.V, dtype), batched=batched)
            for shape in args.shapes.split(","):
                B, T, H = parse_shape(shape)
                th = B * T * H
                x = make_inputs(op, B, T, H, args.K, args.V, dtype)
                seq = None
                if args.skip_sequential_above is None or th <= args.skip_sequential_above:
                    load = os.getloadavg()[0]
                    dt_s, out_s, _ = timed(op, x, batched=False)
                    seq = (dt_s, out_s)
                    w.writerow({"op": op, "shape": shape, "dtype": args.dtype, "K": args.K, "V": args.V,
                                "token_heads": th, "mode": "sequential", "seconds": f"{dt_s:.2f}",
                                "us_per_token_head": f"{dt_s / th * 1e6:.1f}", "speedup": "1", "bits_equal": "",
                                "load_avg_1m_before": f"{load:.2f}", "commit": commit})
                    f.flush()
                    print(f"{op} {shape} sequential {dt_s:.1f}s", flush=True)
                load = os.getloadavg()[0]
                dt_b, out_b, session = timed(op, x, batched=True)
                c = session.settings.get("grid_launches", {})
                eq = "" if seq is None else str(bits_equal(seq[1], out_b))
                speed = "sequential skipped" if seq is None else f"{seq[0] / dt_b:.1f}"
                w.writerow({"op": op, "shape": shape, "dtype": args.dtype, "K": args.K, "V": args.V,
                            "token_heads": th, "mode": "batched", "seconds": f"{dt_b:.2f}",
                            "us_per_token_head": f"{dt_b / th * 1e6:.1f}", "speedup": speed, "bits_equal": eq,
                            "launches_batched": c.get("batched", 0), "launches_split": c.get("split", 0),
                            "launches_sequential": c.get("sequential", 0),
                            "sequential_reasons": "; ".join(c.get("sequential_reasons", [])),
                            "load_avg_1m_before": f"{load:.2f}", "commit": commit})
                f.flush()
                print(f"{op} {shape} batched {dt_b:.1f}s speedup {speed} bits_equal {eq} launches {c}", flush=True)
    write_readme(out, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
