"""Every candidate of the peer table judged twice: against fla's emulated rows (its folder's gpu.csv.gz, what the
peer table reads) and against fla's native H200 rows of the same cases and inputs (this folder). Prints one line per
candidate with both verdict counts, then every (case, tensor, metric) whose verdict differs.

    python reports/h200-native/rejudge.py [--cases SUBSTRING] [CANDIDATE_FILE ...]

Each gate is the shipped `parity gate` with its default policy; the native baseline is cut to the cases of the
emulated one, so both judge the same comparisons. Extra candidate files (e.g. a fresh TPU leg run) are judged against
the native rows alone and against their own folder's gpu.csv if it has one."""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
from harness.core.results import exact_float_keywords  # noqa: E402  (rows read back exactly, as the gate reads them)
PEERS = ROOT / "reports" / "peers"
SKIP = ("gpu.", "causality", "compile", "errors.", "deltanet.csv")  # not a candidate's gated rows
KEY = ["case_id", "tensor", "metric"]


def read(path, **kwargs) -> pd.DataFrame:
    return pd.read_csv(path, dtype={"input_sha256": str}, **exact_float_keywords(), **kwargs)


def native_rows() -> pd.DataFrame:
    return pd.concat([read(HERE / f)
                      for f in ("gpu-smoke-regressions.csv.gz", "gpu-peers.csv.gz")], ignore_index=True)


def gate(baseline: Path, candidate: Path, leg: str, out: Path) -> pd.DataFrame:
    cmd = [sys.executable, "-m", "harness.cli", "gate", str(baseline), str(candidate), "--baseline-leg", "gpu",
           "--candidate-leg", leg, "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if not (out / "parity.csv").exists():
        raise SystemExit(f"gate failed on {candidate}: {done.stderr.strip().splitlines()[-1:]}")
    return pd.read_csv(out / "parity.csv")[KEY + ["verdict", "ratio", "eps_gpu"]]


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def candidates(folder: Path):
    for path in sorted(folder.glob("*.csv*")):
        if path.name.startswith(SKIP) or path.name.endswith(".md"):
            continue
        head = pd.read_csv(path, nrows=1)
        if "leg" in head.columns and head["leg"].iloc[0] != "gpu":
            yield path, head["leg"].iloc[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="", help="only case ids holding this substring")
    parser.add_argument("--flips", type=Path, help="also write the differing verdicts to this CSV")
    parser.add_argument("--only-extra", action="store_true", help="judge only the files named, not the peer folders")
    parser.add_argument("extra", nargs="*", type=Path)
    args = parser.parse_args()
    native = native_rows()
    native = native[native.case_id.str.contains(args.cases, regex=False)]
    flips = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        jobs = [(folder / ("gpu.csv.gz" if (folder / "gpu.csv.gz").exists() else "gpu.csv"), path, leg)
                for folder in sorted(p for p in PEERS.iterdir() if p.is_dir()) for path, leg in candidates(folder)]
        jobs = [] if args.only_extra else jobs
        jobs += [(None, path.resolve(), pd.read_csv(path, nrows=1)["leg"].iloc[0]) for path in args.extra]
        print("| candidate | file | vs emulated fla | vs native fla (H200) |\n|---|---|---|---|")
        for n, (emulated, path, leg) in enumerate(jobs):
            cand = read(path)
            cand = cand[cand.case_id.str.contains(args.cases, regex=False)]
            cases = set(cand.case_id)
            if emulated is not None and emulated.exists():
                cases &= set(pd.read_csv(emulated, usecols=["case_id"]).case_id)
            base = native[native.case_id.isin(cases)]
            if base.empty:
                continue
            (tmp / f"n{n}").mkdir()
            base.to_csv(tmp / f"n{n}" / "gpu.csv", index=False)
            cut = tmp / f"c{n}"
            cut.mkdir()
            cand[cand.case_id.isin(cases)].to_csv(cut / f"{leg}.csv", index=False)
            v_n = gate(tmp / f"n{n}" / "gpu.csv", cut / f"{leg}.csv", leg, tmp / f"gn{n}")
            if emulated is not None and emulated.exists():
                em = read(emulated)
                (tmp / f"e{n}").mkdir()
                em[em.case_id.isin(cases)].to_csv(tmp / f"e{n}" / "gpu.csv", index=False)
                v_e = gate(tmp / f"e{n}" / "gpu.csv", cut / f"{leg}.csv", leg, tmp / f"ge{n}")
            else:
                v_e = v_n.assign(verdict="")
            both = v_e.merge(v_n, on=KEY, suffixes=("_emulated", "_native"))
            count = lambda s: ", ".join(f"{k} {v}" for k, v in s.value_counts().sort_index().items() if k)
            print(f"| {leg} | {shown(path)} | {count(both.verdict_emulated) or '-'} | "
                  f"{count(both.verdict_native)} |")
            diff = both[(both.verdict_emulated != both.verdict_native) & (both.verdict_emulated != "")]
            flips.append(diff.assign(candidate=leg, file=shown(path)))
    flips = pd.concat(flips) if flips else pd.DataFrame()
    print(f"\n{len(flips)} verdicts differ")
    if len(flips):
        cols = ["candidate", "case_id", "tensor", "metric", "verdict_emulated", "verdict_native", "ratio_emulated",
                "ratio_native", "eps_gpu_emulated", "eps_gpu_native"]
        print(flips[cols].to_string(index=False, float_format="{:.4g}".format))
        if args.flips:
            flips[cols].to_csv(args.flips, index=False)


if __name__ == "__main__":
    main()
