"""The command line of ``parity``: every verb's options, declared once (:func:`build_parser`). The verbs
themselves are :mod:`harness.cli`'s, which turns a parsed command line into settings records and runs it."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.core.noise import LOOKS
from harness.legs.registry import default_leg, legs
from harness.legs.tpu import GRIDS
from harness.app.workers import CANDIDATE_CASE_TIMEOUT
from harness.core.memory import GIB_PER_JOB

DEFAULT_OUT = Path("reports") / "runs"
DESCRIPTION = """parity: list cases, run legs, gate result files, or do it all.

Exit codes: 0 pass; 1 a parity or bound violation (or an error row); 2 usage
or input error (bad arguments, unwritable paths, unreadable, malformed or stale
result files); 3 inconclusive (the gate's draws did not decide a comparison: never a pass); 130 interrupted (the
finished cases are kept: see --resume).
"""


def _add_selection(p, shard=True):
    p.add_argument("--suite", default="smoke",
                   help="suite name, or several joined by commas: smoke, regressions, standard, stress")
    p.add_argument("--case", action="append", default=[], metavar="ID",
                   help="run just this case (repeatable; overrides --suite): a suite case's id, or any "
                        "well-formed id of a case of your own, e.g. "
                        "simple_gla.chunk/B1-T80-H1-K128-V128/bf16/g=logsigmoid/16/C64/h0")
    p.add_argument("--cases-file", action="append", default=[], metavar="TOML",
                   help="run the cases of this TOML file (repeatable; overrides --suite, adds to --case): "
                        "[[case]] tables of Case fields or ids, [[grid]] tables expanded over their lists; "
                        "see cases/examples/my_cases.toml")
    p.add_argument("--op", action="append", default=[],
                   help="keep only cases of this op, or of several joined by commas: simple_gla,gla (repeatable)")
    p.add_argument("--draws", type=int, default=1, metavar="N",
                   help="run each case over N input draws: Case.seed 0..N-1 (the id says seed=k for k > 0)")
    if shard:
        p.add_argument("--shard", metavar="i/n", help="deterministic shard i of n (0-based)")


def _add_impl(p):
    p.add_argument("--impl", action="append", default=[], metavar="NAME=module:object",
                   help="register an implementation as the candidate leg NAME (harness.legs.external: per op "
                        "a binding of its forward, refusals and packed sequences); repeatable")


def _add_case_timeout(p):
    p.add_argument("--case-timeout", metavar="SECONDS",
                   help="run every case in a worker process of its own and stop one that runs longer (0: no limit); "
                        "a case that exits, crashes or is stopped becomes error rows that say how, the run goes on, "
                        f"and the command exits 4 (default: outside implementations {CANDIDATE_CASE_TIMEOUT:g} s, "
                        "this project's legs in the command's own process at --jobs 1)")


def _add_run_options(p, resume: bool = True):
    p.add_argument("--out", default=str(DEFAULT_OUT), help=f"output directory (default {DEFAULT_OUT})")
    p.add_argument("--tag", help="insert a tag in result file names, e.g. gpu.<tag>.csv")
    if resume:
        p.add_argument("--resume", action="store_true",
                       help="continue an interrupted run from its <leg>.partial.csv, skipping the cases it has")
    p.add_argument("--force", action="store_true",
                   help="overwrite a result file of another suite, or discard an interrupted run's partial file")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--jobs", "-j", metavar="N",
                   help="use up to N cores: each leg runs N cases at once, each in a worker process (default: "
                        f"$PARITY_JOBS, else one per CPU and per {GIB_PER_JOB} GiB of memory; 1: no workers); cases "
                        "the caches serve never start one, and the rows come out in case order at any N")
    _add_case_timeout(p)
    p.add_argument("--no-ref-cache", action="store_true", help="do not read or write the on-disk reference cache")
    p.add_argument("--no-baseline-cache", "--no-gpu-cache", dest="no_baseline_cache", action="store_true",
                   help="run the GPU, reference and TPU legs (and their causality runs) again instead of reusing "
                        "their caches; the fresh results replace the entries (--no-gpu-cache: the old name)")
    p.add_argument("--ref-method", default="recurrent", choices=("recurrent", "chunk"),
                   help="reference leg: formulation recomputed against the chunked golden (default recurrent)")
    p.add_argument("--ref-dtype", default="float64", choices=("float64", "float32"),
                   help="reference leg: compute dtype (float32 gives a second honest result file)")
    p.add_argument("--tpu-targets", metavar="T,..",
                   help="TPU leg, when emulated: compile each case for these real TPU targets first, a case that "
                        "does not compile is an error (default v6e; of v4, v5e, v5p, v6e, v7x)")
    p.add_argument("--grid", choices=GRIDS,
                   help="the emulated legs: how each kernel launch's grid is walked: batched (every parallel program "
                        "in one pass) or per-program (one program after another, the interpreters' own loops); the "
                        "rows are bit for bit the same (default: $PARITY_TPU_GRID for the TPU leg and "
                        "$PARITY_BATCHED_GRID for the GPU leg, else batched)")
    p.add_argument("--dot-precision", default=None, choices=("tf32", "tf32x3", "ieee"),
                   help="GPU leg: TRITON_F32_DEFAULT for f32 tl.dot without an explicit input_precision "
                        "(default: the environment's, else tf32 as on an H100)")


def _add_gate_options(p):
    p.add_argument("--allow-missing", action="store_true",
                   help="a (case, tensor) in one file only is counted and shown, not failed (a deliberate subset)")
    p.add_argument("--allow-partial", action="store_true",
                   help="judge the partial file of a run that did not finish (<leg>...partial.csv); the verdict is "
                        "then UNFINISHED RUN, never a pass (without it such a file is refused: finish the run with "
                        "--resume)")
    p.add_argument("--baseline-leg", default=default_leg("baseline"),
                   help=f"the leg the baseline file must come from (default {default_leg('baseline')})")
    p.add_argument("--candidate-leg", default=default_leg("candidate"),
                   help=f"the leg the candidate file must come from (default {default_leg('candidate')}; "
                        "any registered leg, e.g. an --impl)")
    _add_impl(p)
    p.add_argument("--junit", metavar="FILE",
                   help="also write the verdicts as JUnit XML, one test case per (case, tensor); replaces only a "
                        "file an earlier gate wrote, unless --force")


def _add_policy(p):
    p.add_argument("--policy", metavar="TOML",
                   help="policy file, e.g. a policy.toml written by `parity calibrate` (default: the shipped, "
                        "calibrated harness/policy.toml); the options below override it")
    p.add_argument("--gate-metrics",
                   help="comma-separated metrics to gate (of max_abs, rel_l2, ulp_max, ulp_mean, ulp_p99)")
    p.add_argument("--margin", type=float,
                   help="one relative margin for every metric, replacing the policy's: allow eps_gpu*(1+margin)")
    p.add_argument("--floor", help="absolute floors, e.g. rel_l2=1e-6,max_abs=1e-5")
    p.add_argument("--alpha", type=float,
                   help="one-sided level of the rel_l2 bootstrap (0: judge the point value alone)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parity", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="verb", required=True)

    p = sub.add_parser("cases", help="list the case ids of a suite and the tensors each compares")
    _add_selection(p)
    p.add_argument("--inputs", action="store_true",
                   help="under each case, every input a candidate binding's forward receives: name, shape, dtype")
    p.add_argument("--explain", action="append", default=[], metavar="ID",
                   help="a case id in words, part by part: its shapes, gate (law, '/x' normalizer, lb, mask), "
                        "packing, flags and each option with its meaning in the op, the tensors it compares and the "
                        "bindings that refuse it (repeatable; instead of the list)")
    p.set_defaults(verb_fn="cases")

    p = sub.add_parser("run", help="run one leg over a suite and write its result CSV")
    p.add_argument("--backend", required=True, metavar="LEG",
                   help=f"which leg to run: {', '.join(legs())}, or an implementation named by --impl")
    _add_impl(p)
    _add_selection(p)
    _add_run_options(p)
    p.set_defaults(verb_fn="run")

    p = sub.add_parser("causality", help="check that inputs after t0 do not change o and dq up to t0")
    p.add_argument("--backend", required=True, metavar="LEG",
                   help=f"which leg to check: {', '.join(legs())}, or an implementation named by --impl")
    _add_impl(p)
    _add_selection(p)
    _add_run_options(p, resume=False)  # a check is re-run whole: there is nothing to resume
    p.set_defaults(verb_fn="causality")

    p = sub.add_parser("gate", help="apply eps_TPU <= eps_GPU to two result files")
    p.add_argument("gpu_csv", help="baseline result file (the GPU leg), or a directory holding exactly one")
    p.add_argument("tpu_csv", help="candidate result file (the TPU leg), or a directory holding exactly one")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="where parity.csv and parity.md go")
    p.add_argument("--suite", metavar="S", help="judge only this suite's cases (and their draws) of the two files")
    p.add_argument("--case", action="append", default=[], metavar="ID",
                   help="judge only this case (and its draws) of the two files (repeatable); a selected case "
                        "either file lacks still fails, the files' other cases are not judged")
    p.add_argument("--cases-file", action="append", default=[], metavar="TOML",
                   help="judge only the cases of this TOML file (repeatable)")
    p.add_argument("--op", action="append", default=[], help="judge only the cases of this op (repeatable)")
    _add_policy(p)
    _add_gate_options(p)
    p.add_argument("--force", action="store_true", help="overwrite a --junit FILE that the gate did not write")
    p.set_defaults(verb_fn="gate")

    p = sub.add_parser("compile", help="compile every TPU case (forward and backward) for real TPU targets "
                                       "with libtpu, no TPU needed; writes compile.csv")
    _add_selection(p)
    p.add_argument("--target", metavar="T,..", help="TPU targets (default v5e,v6e,v7x; of v4, v5e, v5p, v6e, v7x)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help=f"output directory (default {DEFAULT_OUT})")
    p.add_argument("--tag", help="insert a tag in the file name: compile.<tag>.csv")
    p.add_argument("--reuse", action="append", metavar="CSV[,CSV]",
                   help="earlier compile.csv files (gzipped or not): an ok row whose content key (the sources, "
                        "versions and case it was made from, the target) is the one this compile would have is "
                        "reused, not compiled again; any other case compiles (repeatable)")
    p.add_argument("--backend", default=default_leg("candidate"), metavar="LEG",
                   help="the candidate leg whose binding compiles (default tpu, this project's kernels; another "
                        "writes compile.<leg>.csv)")
    _add_impl(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--jobs", "-j", metavar="N",
                   help="compile N cases at once, each in a worker process (libtpu compiles on one core; default: "
                        f"$PARITY_JOBS, else one per CPU and per {GIB_PER_JOB} GiB of memory; 1: no workers); the "
                        "rows come out in case order at any N")
    _add_case_timeout(p)
    p.set_defaults(verb_fn="compile")

    p = sub.add_parser("peers", help="one table for every peer: README.md and index.html from the rows of every "
                                     "report under a folder (default reports/peers)")
    p.add_argument("--root", default="reports/peers", help="the folder of reports (default reports/peers)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if the pages differ from the rows")
    p.add_argument("--force", action="store_true", help="replace a README.md that parity peers did not write")
    p.add_argument("--native", action="append", default=[], metavar="DIR",
                   help="folders of fla's native rows, the baseline of record where they hold a case's inputs "
                        "(repeatable; default reports/h200-native where it exists; harness/judge/baseline.py)")
    p.add_argument("--no-native", action="store_true",
                   help="judge every report against its own fla rows only (emulated, as before the native rows)")
    _add_policy(p)
    p.set_defaults(verb_fn="peers")

    p = sub.add_parser("fidelity", help="fla's emulated rows against its native rows of the same cases and inputs: "
                                        "per path x dtype x tensor the median rel_l2 ratio, mean |ln ratio| and "
                                        "worst element bit-equal, and the verdicts that move between the two",
                       description="Pair the baseline leg's emulated rows (Triton interpreter) with its native rows "
                                   "(a GPU) on (case_id, tensor, input_sha256) and print, per path (op.variant) x "
                                   "dtype x tensor, per path x dtype (with issue 76's targets) and overall: the rows "
                                   "compared (both ok), the median of rel_l2(emulated)/rel_l2(native), the mean "
                                   "|ln ratio| and the rows whose worst element (worst_index, got_at_worst) is "
                                   "bit-equal (docs/definitions.md, Fidelity). Exit 2 on files that are not "
                                   "result files, files of mixed modes or of one mode only, and rows of the same case and "
                                   "tensor made from other inputs.")
    p.add_argument("files", nargs="+", metavar="CSV",
                   help="result files of the baseline leg, each all emulated or all native (both modes needed); a "
                        "row given twice on one side is taken from the first file")
    p.add_argument("--candidate", action="append", default=[], metavar="CSV",
                   help="a candidate's result file: list the verdicts that change when it is judged against the "
                        "emulated rows and against native rows where they exist (repeatable)")
    p.add_argument("--out", metavar="DIR", help="also write fidelity.csv and fidelity.md (and fidelity-verdicts.csv "
                                                "with --candidate) here")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when a path x dtype misses one of issue 76's targets (else they are only printed)")
    p.add_argument("--force", action="store_true", help="replace a fidelity.md that parity fidelity did not write")
    _add_policy(p)
    p.set_defaults(verb_fn="fidelity")

    p = sub.add_parser("merge", help="merge shard result files of one leg into one CSV")
    p.add_argument("-o", "--output", required=True, help="merged CSV to write (never one of the inputs)")
    p.add_argument("inputs", nargs="+", help="shard CSVs")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    p.add_argument("--allow-mixed", action="store_true",
                   help="merge files of different suites, commits, modes or devices")
    p.set_defaults(verb_fn="merge")

    p = sub.add_parser("calibrate", help="run the gpu and tpu legs over several input draws and report the "
                                         "policy's false-alarm rate and the ratio noise band on clean kernels")
    _add_selection(p)
    p.set_defaults(draws=5)
    _add_run_options(p)
    _add_policy(p)
    p.add_argument("--results", nargs=2, metavar=("GPU.csv", "TPU.csv"),
                   help="calibrate from these result files instead of running the legs")
    p.set_defaults(verb_fn="calibrate")

    _add_mxu_probe(sub)
    _add_ptx(sub)

    p = sub.add_parser("all", help="run every leg this machine can run (emulated without hardware), then gate")
    _add_selection(p, shard=False)
    _add_run_options(p)
    _add_policy(p)
    _add_gate_options(p)
    p.add_argument("--no-causality", action="store_true",
                   help="skip the causality and isolation check (one case per op and variant) of every leg, "
                        "the candidates' included")
    p.add_argument("--baseline-rows", type=Path, action="append", default=[], metavar="GPU.csv",
                   help="the baseline leg's rows, made where fla runs (parity run --backend gpu, same selection): "
                        "not run here (a TPU-side stack has no torch); repeatable: the files' rows are pooled (the "
                        "first run's and the draws made later). The draws that decide an inconclusive comparison "
                        "and that these rows lack are made by --baseline-python, or printed as that stack's command "
                        "(and the comparison stays inconclusive, exit 3)")
    p.add_argument("--baseline-python", metavar="PYTHON",
                   help="with --baseline-rows: the Python of the stack where the baseline runs (this project "
                        "installed there, e.g. .venv/bin/python); the draws an inconclusive comparison needs and the "
                        "baseline rows lack are made there, kept in OUT/<leg>.draws.csv and pooled")
    p.add_argument("--candidate", action="append", default=[], metavar="LEG",
                   help="also run this candidate (a registered implementation, e.g. tpu-inference, or --impl) and "
                        "gate it against the gpu leg in OUT/LEG/; OUT/peers.md then compares the candidates "
                        "(repeatable)")
    p.add_argument("--max-draws", type=int, default=LOOKS[-1], metavar="N",
                   help=f"draw an inconclusive case at most N times in all (default {LOOKS[-1]}, the sequential "
                        f"test's cap; the looks are at {', '.join(map(str, LOOKS))} draws): a comparison still "
                        "undecided stays inconclusive (exit 3) and names the draws that would decide it")
    p.set_defaults(verb_fn="all")
    _add_bisect(sub)
    return parser


def _add_bisect(sub) -> None:
    p = sub.add_parser(
        "bisect", help="which version of a candidate changed a verdict: its rows over PyPI releases or commits, "
                       "each judged by the gate against one set of baseline rows (docs/bisect.md)",
        description="Install each version of a candidate once (uv, --no-deps, a cached folder layered on this "
                    "stack), run its cases, gate each version against one set of baseline rows, and find the first "
                    "version where each comparison (case, tensor) changes verdict (or, with --all, the whole "
                    "history). Writes history.csv/.md/.png/.html, crossings.csv, bisect-log.txt and versions/ "
                    "(every version's rows, reused: a measured (version, case, draw) is never run again).")
    p.add_argument("--candidate", metavar="LEG", help="the candidate leg (a registered implementation), or the baseline "
                                                       "leg for its own history (required unless --replay)")
    p.add_argument("--versions", metavar="SPEC",
                   help="PyPI releases: a requirement ('tpu-inference>=0.20,<=0.32', pre-releases and yanked "
                        "releases left out) or a list in order ('tpu-inference==0.20.0,0.21.0')")
    p.add_argument("--git", metavar="DIR", help="a local git checkout of the candidate's package (with --commits)")
    p.add_argument("--commits", metavar="A..B", help="with --git: commit A, then each first-parent commit up to B")
    p.add_argument("--all", dest="sweep", action="store_true", help="measure every version: the whole history")
    p.add_argument("--good", metavar="V", help="bisect from this version (default the first)")
    p.add_argument("--bad", metavar="V", help="bisect up to this version (default the last)")
    p.add_argument("--skip", action="append", default=[], metavar="V", help="never measure this version (repeatable)")
    p.add_argument("--replay", metavar="LOG", help="run a bisect-log.txt again: its arguments and its good/bad/skip "
                                                    "lines (edit them first, as with git bisect replay)")
    _add_selection(p, shard=False)
    p.add_argument("--baseline-rows", action="append", default=[], metavar="CSV",
                   help="the baseline's rows of the selected cases, made once (else the baseline leg runs once here, "
                        "into OUT/baseline/)")
    p.add_argument("--out", help="output directory (default reports/bisect/<candidate>)")
    p.add_argument("--cache", metavar="DIR", help="where each version is installed (default $PARITY_BISECT_CACHE, "
                                                   "else ~/.cache/linear-attn-parity/bisect)")
    p.add_argument("--uv", metavar="PATH", help="the uv to install with (default: on PATH, or beside this Python)")
    p.add_argument("--tpu-targets", metavar="T,..", help="passed to each version's parity run")
    _add_case_timeout(p)
    p.add_argument("--force", action="store_true", help="write into an --out that holds another bisection")
    _add_impl(p)
    _add_policy(p)
    p.set_defaults(verb_fn="bisect")


def _add_ptx(sub) -> None:
    p = sub.add_parser(
        "ptx", help="check the emulated GPU leg's assumptions in Triton's PTX of fla's kernels (sm_80, sm_90)",
        description="Run the GPU leg (emulated) over the cases to record each fla kernel launch's specialization, "
                    "compile each with Triton's own pipeline to PTX for each target (no GPU needed), and check the "
                    "emulation's assumptions (harness/emulation/gpu_model.py) in the PTX. Writes ptx.csv "
                    "(kernel, target, assumption, expected, found, status), facts.json (the emulation's facts), "
                    "launches.json (the specializations), key.json (the inputs' content key) and compiled/ (TTIR, PTX, "
                    "PTX without FP fusion); exit 1 on any mismatch or kernel that does not compile, 2 on bad input.")
    p.add_argument("--suite", default="smoke", help="suite(s) whose cases the GPU leg runs (default smoke)")
    p.add_argument("--case", action="append", default=[], help="a case id instead of --suite (repeatable)")
    p.add_argument("--target", default="sm80,sm90", help="comma-separated: sm80, sm90 (default both)")
    p.add_argument("--out", default="reports/runs/ptx", help="output directory (default reports/runs/ptx)")
    p.add_argument("--launches", default=None,
                   help="a launches.json of an earlier run: compile and check its kernels, skip the capture")
    p.add_argument("--reuse", default=None, metavar="DIR",
                   help="a record of an earlier sweep (key.json and ptx.csv[.gz]): when it was made from exactly "
                        "these inputs (code, cases, versions, targets, the emulation's facts) and its rows are clean "
                        "and unedited, copy it to --out and stop; otherwise say what differs and run the sweep")
    # the leg whose fla launches it records
    p.set_defaults(verb_fn="ptx", backend=default_leg("baseline"))


def _add_mxu_probe(sub) -> None:
    from harness.probes.mxu_probe import CSV_NAME, DEFAULT_OUT as PROBE_OUT, DEFAULT_TARGET, PRECISIONS

    p = sub.add_parser("mxu-probe", help="run single-product kernels and say bit for bit how the MXU rounds each "
                                         "operand at each dot precision (on a CPU: a dry run of the MXU model)")
    p.add_argument("--out", default=str(PROBE_OUT), help=f"where {CSV_NAME} goes (default {PROBE_OUT})")
    p.add_argument("--precision", metavar="P,..",
                   help=f"the dots to probe (default all: {', '.join(PRECISIONS)})")
    p.add_argument("--target", default=DEFAULT_TARGET,
                   help=f"dry run only: the real TPU each kernel is first compiled for (default {DEFAULT_TARGET})")
    p.set_defaults(verb_fn="mxu_probe")
