"""The gate: join a baseline and a candidate result file and apply ε_TPU ≤ ε_GPU (ε of the candidate ≤ ε of
the baseline; the columns keep the rule's names, ``eps_gpu`` and ``eps_tpu``, whatever the legs).

It fails closed. Before judging, the files must be fit to compare, else
:class:`GateInputError` (exit 2) says why:

- each file passes :func:`harness.report.reports.check_results` (known statuses,
  numeric non-negative metrics, a sha256 on every measured row, ...);
- the baseline comes from the registry's built-in baseline leg and the candidate from its built-in
  candidate (:func:`harness.legs.registry.default_leg`: their ``leg`` column and the package their
  ``versions`` name), unless other legs are asked for explicitly; one file is never compared with itself;
- every (case, tensor) in both files was run on the same inputs
  (``input_sha256``), row by row.

Verdicts, per (case, tensor) and, where both legs have numbers, per metric:

================= ==========================================================
``pass``/``fail`` gated metric: ``eps_tpu <= eps_gpu*(1+margin)+floor``; for
                  rel_l2 a point failure stands only if the paired block
                  bootstrap's lower bound of the ratio (``ratio_lower``)
                  exceeds 1 + margin too (:meth:`Policy.judge`). Over a
                  case's draws in the files a comparison has one verdict,
                  the sequential test's (:func:`_pool_draws`): the first
                  draw's where it decides, else the first pooled look that
                  decides (:func:`harness.core.noise.sequential_decision`); more
                  draws never add a failure to a decided comparison
``inconclusive``  a failure the draws do not decide (one draw decides only
                  a rel_l2 failure its bootstrap confirms on a tensor of
                  BOOTSTRAP_MIN_ELEMENTS or more): the reason names the
                  draws that would (3, 8, then 24, the cap); never a pass
``info``          a metric reported but not gated by the policy
``fail``          TPU row ``error``, ``nonfinite`` or ``bound``; the TPU
                  gives no tensor the GPU gives; the GPU row is an ``error``
                  (a broken baseline measures nothing); or the (case, tensor)
                  is in one file only
``missing``       in one file only, with ``allow_missing`` (a deliberate
                  subset): counted and shown, not failed
``bounds_only``   no GPU number (``not_provided``, ``unsupported`` or out of
                  bounds); the TPU passed its absolute bound
``unsupported``   the TPU leg cannot run the case (with its reason)
``not_provided``  neither leg gives the tensor
``forward_only``  the candidate is a forward-only implementation and the
                  tensor is a gradient: not compared, and the gate's headline
                  says the PASS covers the forward tensors only
``no_gradient``   the candidate's binding declares it gives no gradient of
                  this input by design (``LegBinding.no_gradient``, with its
                  reason): not compared, and the headline counts it
================= ==========================================================

A gate that compares no gated metric at all fails (a ``coverage`` row, unless
it already fails for another reason).
``fail`` makes the gate fail, and ``inconclusive`` keeps it from passing (exit 3 on the CLI). Every failure
is collected; the caller exits once.
"""

from __future__ import annotations

import functools
import json
import math
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from cases.case import Case

from harness.legs.registry import default_leg, version_key
from harness.core.metrics import METRICS, parse_blocks
from harness.core.noise import BOOTSTRAP_MIN_ELEMENTS, next_look, sequential_decision
from harness.core.policy import Policy
from harness.core.results import KEY, ReportError, check_results, read_table, unfinished
from harness.core.status import FAILING, FORWARD_ONLY, NO_GRADIENT, Status

PARITY_COLUMNS = ["case_id", "tensor", "metric", "eps_gpu", "eps_tpu", "ratio", "ratio_lower", "allowed", "verdict",
                  "reason", "draws",
                  "gpu_status", "tpu_status", "gpu_mode", "tpu_mode", "tpu_mxu_cost", "input_sha256", "repro"]


class GateInputError(ReportError):
    """The two files cannot be compared (stale baseline, wrong legs)."""


@dataclass
class GateResult:
    parity: pd.DataFrame
    policy: Policy
    baseline: pd.DataFrame  # the baseline file's rows (checked)
    candidate: pd.DataFrame  # the candidate file's rows (checked)
    baseline_leg: str
    candidate_leg: str
    unfinished: tuple[str, ...] = ()  # the partial files of unfinished runs judged (--allow-partial)

    @property
    def failures(self) -> pd.DataFrame:
        return self.parity[self.parity["verdict"] == "fail"]

    def named_parity(self) -> pd.DataFrame:
        """:attr:`parity` with each side's columns named by the leg it compared (:func:`side_columns`): what
        parity.csv holds."""
        return self.parity.rename(columns=side_columns(self.baseline_leg, self.candidate_leg))

    @property
    def inconclusive(self) -> pd.DataFrame:
        """Comparisons the draws in the files do not decide (:func:`_pool_draws`)."""
        return self.parity[self.parity["verdict"] == "inconclusive"]

    @property
    def draws_needed(self) -> int | None:
        """The number of input draws that would decide every inconclusive comparison's next look; None when
        none is inconclusive, or when each is at the cap already."""
        pooled = self.inconclusive["draws"].dropna()
        looks = [next_look(int(d)) for d in pooled]
        return max((n for n in looks if n is not None), default=None)

    @property
    def passed(self) -> bool:
        """No failure, nothing inconclusive, no unfinished run: neither of the last two ever reads as a pass."""
        return self.failures.empty and self.inconclusive.empty and not self.unfinished

    @property
    def forward_only(self) -> int:
        """(case, tensor) gradients a forward-only candidate did not provide, so the gate did not compare."""
        return int((self.parity["verdict"] == "forward_only").sum())

    @property
    def no_gradient(self) -> int:
        """(case, tensor) gradients the candidate declares it gives none of by design, so the gate did not compare."""
        return int((self.parity["verdict"] == "no_gradient").sum())

    @property
    def headline(self) -> str:
        """``FAIL``, ``PASS``, or a PASS that counts the gradients it did not compare (a forward-only candidate's,
        those declared absent by design): never a plain PASS then."""
        if not self.failures.empty:
            return "FAIL"
        if self.unfinished:
            return (f"UNFINISHED RUN, not a pass ({', '.join(self.unfinished)}: the partial file of a run that did "
                    f"not finish; judged with --allow-partial)")
        if not self.inconclusive.empty:
            more = f"run with --draws {self.draws_needed}" if self.draws_needed else "at the cap of draws"
            return f"INCONCLUSIVE ({len(self.inconclusive)} comparison(s) not decided by the draws: {more})"
        uncompared = (("FORWARD ONLY", self.forward_only), ("NO GRADIENT BY DESIGN", self.no_gradient))
        return ", ".join(["PASS"] + [f"{what} ({n} gradient tensor(s) of the baseline not compared)"
                                     for what, n in uncompared if n])


def check_legs(df: pd.DataFrame, leg: str, role: str, name: str) -> None:
    """The rows of ``df`` (the ``role`` file, called ``name``) come from ``leg``: their ``leg`` column says so
    and their ``versions`` name the leg's package (``LegSpec.version_key``, :mod:`harness.legs.registry`)."""
    found = sorted(df["leg"].dropna().unique())
    if found and found != [leg]:
        raise GateInputError(f"{name}: the {role} must come from the {leg} leg, its rows are from {found[0]}; "
                             f"to compare other legs say so (--{role}-leg {found[0]})")
    key = version_key(leg)
    versions = df["versions"] if "versions" in df.columns else pd.Series([None] * len(df), index=df.index)
    for i, text in versions.items():
        try:
            named = key in json.loads(text)
        except (TypeError, ValueError):
            named = False
        if not named:
            raise GateInputError(f"{name}:{int(i) + 2}: column 'versions' names no {key}, so this row was not "
                                 f"made by the {leg} leg it claims")


def _check_hashes(baseline: pd.DataFrame, candidate: pd.DataFrame) -> None:
    both = baseline[KEY + ["input_sha256"]].merge(candidate[KEY + ["input_sha256"]], on=KEY,
                                                  suffixes=("_baseline", "_candidate"))
    both = both.dropna(subset=["input_sha256_baseline", "input_sha256_candidate"])  # error rows of invalid cases
    stale = sorted(set(both.loc[both["input_sha256_baseline"] != both["input_sha256_candidate"], "case_id"]))
    if stale:
        listed = "\n  ".join(stale[:20]) + ("\n  ..." if len(stale) > 20 else "")
        raise GateInputError(
            f"{len(stale)} case(s) were run on different inputs (input_sha256 differs), so their errors are "
            f"not comparable; re-run the baseline with this version of the harness:\n  {listed}")


def _ratio(eps_candidate: float, eps_baseline: float) -> float:
    if eps_baseline == 0:
        return 1.0 if eps_candidate == 0 else math.inf
    return eps_candidate / eps_baseline


def shown_apart(a: float, b: float, digits: int = 4) -> tuple[str, str]:
    """``a`` and ``b`` printed with the fewest significant digits (at least ``digits``) that tell them apart, so
    that a comparison near its limit never reads "1.05 > 1.05"; equal numbers print alike."""
    for d in range(digits, 18):
        x, y = f"{a:.{d}g}", f"{b:.{d}g}"
        if x != y:
            break
    return x, y


SIDE_COLUMNS = {"eps_gpu": ("eps_{}", 0), "eps_tpu": ("eps_{}", 1), "gpu_status": ("{}_status", 0),
                "tpu_status": ("{}_status", 1), "gpu_mode": ("{}_mode", 0), "tpu_mode": ("{}_mode", 1),
                "tpu_mxu_cost": ("{}_mxu_cost", 1)}
"""The gate's columns of one side: its ε and its rows' status and mode (and the candidate's modeled MXU cost),
by the name its leg's name makes in parity.csv and the side (0 baseline, 1 candidate)."""


def side_columns(baseline_leg: str, candidate_leg: str) -> dict[str, str]:
    """The gate frame's side columns (:data:`SIDE_COLUMNS`, named for the built-in gpu and tpu legs) renamed for
    the legs it compared: ``eps_tokamax``, ``tokamax_status``. For the built-in pair every name stays."""
    legs = (baseline_leg, candidate_leg)
    return {column: name.format(legs[side]) for column, (name, side) in SIDE_COLUMNS.items()}


def side_labels(baseline_leg: str, candidate_leg: str) -> tuple[str, str]:
    """What the gate's reasons and reports call its two sides: GPU and TPU for the built-in pair of legs, else the
    legs' own names (a candidate need not be a TPU's: a GPU implementation, or a peer against fla)."""
    if (baseline_leg, candidate_leg) == (default_leg("baseline"), default_leg("candidate")):
        return "GPU", "TPU"
    return baseline_leg, candidate_leg


def _judge(key, baseline, candidate, policy: Policy, allow_missing: bool, sides: tuple[str, str]) -> list[dict]:
    """The verdicts of one (case, tensor) on one draw; a metric row's failure is then weighed against the
    other draws of the case by :func:`_pool_draws`. ``sides``: :func:`side_labels`."""
    b, c = sides
    case_id, tensor = key
    shared = {"case_id": case_id, "tensor": tensor,  # the side columns keep the rule's names (SIDE_COLUMNS)
              "gpu_status": None if baseline is None else baseline["status"],
              "tpu_status": None if candidate is None else candidate["status"],
              "gpu_mode": None if baseline is None else baseline["mode"],
              "tpu_mode": None if candidate is None else candidate["mode"],
              "tpu_mxu_cost": None if candidate is None else candidate.get("mxu_cost"),
              "input_sha256": (candidate if candidate is not None else baseline)["input_sha256"],
              "repro": None if candidate is None else candidate.get("repro")}

    def status_row(verdict, reason):
        return [{**shared, "metric": "status", "verdict": verdict, "reason": reason}]

    if candidate is None or baseline is None:
        where = f"candidate ({c})" if candidate is None else f"baseline ({b})"
        if allow_missing:
            return status_row("missing", f"not in the {where} file (allowed: --allow-missing)")
        return status_row("fail", f"not in the {where} file; pass --allow-missing to gate a deliberate subset")
    b_status, c_status = baseline["status"], candidate["status"]
    if c_status in FAILING:
        return status_row("fail", f"{c} {c_status}: {candidate['reason']}")
    if c_status == Status.UNSUPPORTED:
        return status_row("unsupported", f"{c}: {candidate['reason']}")
    if c_status == Status.NOT_PROVIDED:
        if b_status == Status.OK and str(candidate["reason"]).startswith(FORWARD_ONLY):
            return status_row("forward_only", f"{candidate['reason']}: not compared (the candidate is forward only)")
        if b_status == Status.OK and str(candidate["reason"]).startswith(NO_GRADIENT):
            return status_row("no_gradient", candidate["reason"])  # the binding's reason: not compared
        if b_status == Status.OK:
            return status_row("fail", f"the {c} leg gives no such tensor but the {b} leg does")
        return status_row("not_provided", "neither leg gives this tensor")
    # the candidate has numbers within its bound
    if b_status == Status.ERROR:
        return status_row("fail", f"the {b} baseline errored, so nothing is measured: {baseline['reason']}")
    if b_status != Status.OK:
        return status_row("bounds_only", f"{c} within its absolute bound; no {b} number ({b} {b_status}: "
                                         f"{baseline['reason']})")
    rows = []
    blocks = parse_blocks(baseline.get("rel_l2_blocks")), parse_blocks(candidate.get("rel_l2_blocks"))
    where = {"op": str(candidate.get("op", "")), "dtype": str(candidate.get("dtype", "")), "tensor": tensor}
    for metric in METRICS:
        eps_b, eps_c = float(baseline[metric]), float(candidate[metric])
        allowed = policy.allowed(metric, eps_b, **where)
        limit = 1 + policy.margin(metric, **where)
        passed, lower = policy.judge(metric, eps_c, eps_b, *blocks, **where)
        shown_c, shown_allowed = shown_apart(eps_c, allowed)
        shown_lower, shown_limit = shown_apart(lower, limit) if lower is not None else ("", "")
        if metric not in policy.metrics:
            verdict, reason = "info", "not gated by the policy"
        elif passed and lower is not None:
            verdict, reason = "pass", (f"eps_tpu {shown_c} > allowed {shown_allowed}, but within noise: bootstrap "
                                       f"lower bound of the ratio {shown_lower} <= {shown_limit}")
        elif passed:
            verdict, reason = "pass", ""
        elif lower is not None:
            verdict, reason = "fail", (f"eps_tpu {shown_c} > allowed {shown_allowed}, beyond noise: bootstrap "
                                       f"lower bound of the ratio {shown_lower} > {shown_limit}")
        else:
            verdict, reason = "fail", f"eps_tpu {shown_c} > allowed {shown_allowed}"
        # one draw decides a failure only where its bootstrap is trusted: rel_l2 on a large enough tensor
        trusted = lower is not None and _numel(candidate) >= BOOTSTRAP_MIN_ELEMENTS
        rows.append({**shared, "metric": metric, "eps_gpu": eps_b, "eps_tpu": eps_c, "ratio": _ratio(eps_c, eps_b),
                     "ratio_lower": lower, "allowed": allowed, "verdict": verdict, "reason": reason, "draws": 1,
                     **({} if trusted else {"_limit": limit})})
    return rows


def _numel(row) -> int:
    """The compared tensor's element count; 0 where the file does not say (files written before the column)."""
    try:
        n = float(row.get("numel"))
    except (TypeError, ValueError):
        return 0
    return int(n) if math.isfinite(n) else 0


@functools.lru_cache(maxsize=4096)
def undrawn_id(case_id: str) -> str:
    """The case's id at draw 0: the key its draws share (an id that does not parse is its own key)."""
    try:
        return Case.from_id(case_id).replace(seed=0).id
    except ValueError:
        return case_id


def of_cases(rows: pd.DataFrame, case_ids) -> pd.Series:
    """Which of ``rows`` are of the cases ``case_ids`` (ids at draw 0) or of their further draws."""
    return rows["case_id"].map(undrawn_id).isin({undrawn_id(i) for i in case_ids})


def _draw_of(row: dict) -> int:
    """A row's input draw: its case's seed (0 for an id that does not parse)."""
    return _seed(row["case_id"])


@functools.lru_cache(maxsize=4096)
def _seed(case_id: str) -> int:
    """Parsed once per id, as :func:`undrawn_id`: every row of every tensor of a case draw asks."""
    try:
        return Case.from_id(case_id).seed
    except ValueError:
        return 0


def _pool_draws(rows: list[dict], policy: Policy) -> list[dict]:
    """Each gated metric of a (case, tensor) over every draw of the case in the files (the rows of the same case
    at other seeds) is one comparison, and the sequential test of docs/definitions.md gives its one verdict,
    which every draw's row then carries (``draws``: how many draws it used):

    - **the first draw decides** where it can: a pass (the point rule, or the block bootstrap within noise) is
      a pass, and a rel_l2 failure the bootstrap confirms on a tensor of
      :data:`harness.core.noise.BOOTSTRAP_MIN_ELEMENTS` or more (its rows carry no ``_limit``) is a failure. Draws
      run later for another comparison of the case neither fail nor pass it;
    - **otherwise the pooled looks** (:func:`harness.core.noise.sequential_decision`: 3, 8, then 24 draws) decide it,
      each on the first draws only, stopping at the first look that decides. A comparison no look decides is
      ``inconclusive``: it names the draws that would decide it, and it never reads as a pass.

    With ``alpha = 0`` (no noise allowance) every draw keeps its own point verdict: a draw's failure is final."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["metric"] in policy.metrics and r["verdict"] in ("pass", "fail") and "ratio" in r:
            groups.setdefault((undrawn_id(r["case_id"]), r["tensor"], r["metric"]), []).append(r)
    for group in groups.values():
        if policy.alpha <= 0:
            continue
        group.sort(key=_draw_of)
        first = group[0]
        if first["verdict"] == "pass" or "_limit" not in first:  # decided by the first draw
            for r in group[1:]:
                if r["verdict"] != first["verdict"]:
                    r["reason"] = (f"{r['reason']}; " if r["reason"] else "") + (
                        f"not judged alone: the comparison was decided on its first draw (draw {_draw_of(first)}, "
                        f"ratio {first['ratio']:.4g}), this draw was run for another comparison of the case")
                r["verdict"] = first["verdict"]
            continue
        limit = first["_limit"]
        decision, used, mean, lower = sequential_decision([r["ratio"] for r in group], limit, policy.alpha)
        for i, r in enumerate(group):
            r["draws"] = used
            own = f"{r['reason']}; " if r["reason"] else f"draw {_draw_of(r)}: ratio {r['ratio']:.4g}; "
            unused = "" if i < used else f" (this draw is not used: the first {used} decided)"
            if decision == "fail":
                r["verdict"] = "fail"
                shown_lower, shown_limit = shown_apart(lower, limit)
                r["reason"] = own + (f"over {used} draws the ratio's geometric mean is {mean:.4g}, its lower bound "
                                     f"{shown_lower} > {shown_limit}{unused}")
            elif decision == "pass":
                r["verdict"] = "pass"
                shown_mean, shown_limit = shown_apart(mean, limit)
                r["reason"] = own + (f"but over {used} draws the ratio's geometric mean is {shown_mean} <= "
                                     f"{shown_limit}: this draw is within the draws' spread{unused}")
            else:
                look = next_look(used)
                r["verdict"] = "inconclusive"
                r["reason"] = own + ("one draw does not decide it: run with --draws 3" if used == 1 else
                                     f"{used} draws do not decide it (geometric mean {mean:.4g}, lower bound "
                                     f"{lower:.4g}): " + (f"run with --draws {look}" if look else
                                                          "inconclusive at the cap of draws"))
    for r in rows:
        r.pop("_limit", None)
    return rows


def apply_gate(baseline: pd.DataFrame, candidate: pd.DataFrame, policy: Policy, *, allow_missing: bool = False,
               baseline_leg: str | None = None, candidate_leg: str | None = None,
               names: tuple[str, str] = ("baseline", "candidate")) -> GateResult:
    """Judge ``candidate``'s rows against ``baseline``'s; see the module docstring. The legs
    default to the registry's built-in baseline and candidate (:func:`harness.legs.registry.default_leg`)."""
    baseline_leg = baseline_leg or default_leg("baseline")
    candidate_leg = candidate_leg or default_leg("candidate")
    baseline, candidate = check_results(baseline, names[0]), check_results(candidate, names[1])
    check_legs(baseline, baseline_leg, "baseline", names[0])
    check_legs(candidate, candidate_leg, "candidate", names[1])
    _check_hashes(baseline, candidate)
    b_rows = {tuple(k): r for k, r in zip(baseline[KEY].itertuples(index=False), baseline.to_dict("records"))}
    c_rows = {tuple(k): r for k, r in zip(candidate[KEY].itertuples(index=False), candidate.to_dict("records"))}
    keys = list(c_rows) + [k for k in b_rows if k not in c_rows]
    rows = []
    for key in keys:
        rows.extend(_judge(key, b_rows.get(key), c_rows.get(key), policy, allow_missing,
                           side_labels(baseline_leg, candidate_leg)))
    parity = pd.DataFrame(_pool_draws(rows, policy), columns=PARITY_COLUMNS)
    gated = parity["metric"].isin(policy.metrics) & parity["verdict"].isin(["pass", "fail", "inconclusive"])
    if not gated.any() and not (parity["verdict"] == "fail").any():  # nothing failed, but nothing was measured
        parity = pd.concat([parity, pd.DataFrame([{
            "case_id": "*", "tensor": "*", "metric": "coverage", "verdict": "fail",
            "reason": f"no gated metric was compared ({len(keys)} (case, tensor) keys, none with numbers in both "
                      f"files): the gate measured nothing"}], columns=PARITY_COLUMNS)], ignore_index=True)
    return GateResult(parity[PARITY_COLUMNS], policy, baseline, candidate, baseline_leg, candidate_leg)


def gate_files(baseline_csv: Path, candidate_csv: Path, policy: Policy, allow_partial: bool = False, select=None,
               **options) -> GateResult:
    """Read and check both files (one file is never compared with itself; the partial file of an unfinished run
    only with ``allow_partial``, and then the verdict says so), then :func:`apply_gate`; ``select``: the rows of each
    file to judge (a function of its rows; a selection of cases), else all."""
    baseline_csv, candidate_csv = Path(baseline_csv), Path(candidate_csv)
    if baseline_csv.exists() and candidate_csv.exists() and baseline_csv.samefile(candidate_csv):
        raise GateInputError(f"{baseline_csv} is given as both the baseline and the candidate")
    partial = tuple(str(p) for p in (baseline_csv, candidate_csv) if unfinished(p))
    if partial and not allow_partial:
        raise GateInputError(f"{partial[0]} is the partial file of a run that did not finish: finish it (the same "
                             f"command with --resume), or judge what it has with --allow-partial (never a pass)")
    # apply_gate checks both files (check_results), naming them
    frames = []
    for path in (baseline_csv, candidate_csv):
        rows = read_table(path)
        if select is not None and {"case_id", "op"} <= set(rows.columns):  # else the gate's check names the file
            rows = select(rows)
            if rows.empty:
                raise GateInputError(f"{path} holds no row of the selected cases: name cases it holds (--case, "
                                     f"--cases-file, --suite, --op), or gate the whole file")
        frames.append(rows)
    result = apply_gate(*frames, policy, names=(str(baseline_csv), str(candidate_csv)), **options)
    return dataclasses.replace(result, unfinished=partial)

