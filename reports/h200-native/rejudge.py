"""Every candidate of the peer table judged twice: against its report's own fla rows (emulated: the Triton
interpreter) and against the baseline of record, fla's native rows of this folder where they hold the case, tensor
and inputs (harness/judge/baseline.py, the rule `parity peers` judges by). Prints one line per candidate file with
both verdict counts, then every (case, tensor, metric) whose verdict differs, with both reasons.

    python reports/h200-native/rejudge.py [--cases SUBSTRING] [--flips CSV] [--only-extra] [CANDIDATE_FILE ...]

The reports and candidate files are the peer table's (harness.report.peer_table: every folder under reports/peers
with fla rows, nested ones included, and each `<leg>.csv[.gz]` beside them); each gate is the shipped policy's,
in-process (harness.judge.fidelity.verdict_moves). Extra candidate files (e.g. a fresh TPU leg run) are judged
against the emulated fla rows of the smoke and regressions suites in this folder and against the native ones."""

import argparse
import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
from harness.core.policy import policy_from_options  # noqa: E402
from harness.core.results import read_results, read_table  # noqa: E402
from harness.judge.baseline import native_rows  # noqa: E402
from harness.judge.fidelity import MOVE_COLUMNS, verdict_moves  # noqa: E402
from harness.legs.registry import default_leg  # noqa: E402
from harness.report.peer_table import result_file, report_folders  # noqa: E402

PEERS = ROOT / "reports" / "peers"


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def candidate_files(folder: Path):
    """The files of a report the peer table reads as candidates' rows (peer_table.candidate_frames' rule)."""
    for path in sorted(folder.iterdir()):
        suffix = next((x for x in (".csv", ".csv.gz") if path.name.endswith(x)), None)
        leg = path.name[:-len(suffix)].rpartition(".")[2] if suffix else ""
        if not leg or leg in (default_leg("baseline"), default_leg("reference")):
            continue
        head = read_table(path)
        if {"leg", "case_id", "tensor", "rel_l2"} <= set(head.columns) and set(head["leg"]) == {leg}:
            yield path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="", help="only case ids holding this substring")
    parser.add_argument("--flips", type=Path, help="also write the differing verdicts to this CSV")
    parser.add_argument("--only-extra", action="store_true", help="judge only the files named, not the peer folders")
    parser.add_argument("extra", nargs="*", type=Path)
    args = parser.parse_args()
    policy = policy_from_options(None, None, None, None, None)
    native = native_rows([HERE])
    cut = lambda rows: rows[rows["case_id"].str.contains(args.cases, regex=False)]  # noqa: E731
    jobs = [] if args.only_extra else [(result_file(folder, default_leg("baseline")), path)
                                       for folder in report_folders(PEERS) for path in candidate_files(folder)]
    jobs += [(HERE / "gpu-smoke-regressions.emulated.csv.gz", path.resolve()) for path in args.extra]
    print("| candidate | file | verdicts | vs emulated fla | vs baseline of record | of which native | changed |\n"
          "|---|---|---|---|---|---|---|")
    flips, total = [], 0
    for emulated, path in jobs:
        moves = verdict_moves(cut(read_results(emulated)), native, cut(read_results(path)), policy)
        if moves.both.empty:
            continue
        count = lambda side: ", ".join(f"{k} {v}" for k, v in moves.counts(side).items())  # noqa: E731
        native_share = int((moves.both["gpu_mode_native"] == "native").sum())
        print(f"| {moves.candidate} | {shown(path)} | {len(moves.both)} | {count('emulated')} | {count('native')} | "
              f"{native_share} | {len(moves.moved)} |")
        total += len(moves.both)
        flips.append(moves.moved.assign(file=shown(path)))
    flips = pd.concat(flips, ignore_index=True) if flips else pd.DataFrame(columns=MOVE_COLUMNS + ["file"])
    print(f"\n{len(flips)} of {total} verdicts differ")
    if len(flips):
        by = flips.groupby(["verdict_emulated", "verdict_native"]).size()
        print("by move: " + ", ".join(f"{a}→{b} {n}" for (a, b), n in by.items()))
        cols = ["candidate", "case_id", "tensor", "metric", "verdict_emulated", "verdict_native", "ratio_emulated",
                "ratio_native", "eps_gpu_emulated", "eps_gpu_native", "reason_native"]
        print(flips[cols].to_string(index=False, float_format="{:.4g}".format))
        if args.flips:
            flips.to_csv(args.flips, index=False)


if __name__ == "__main__":
    main()
