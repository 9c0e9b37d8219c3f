"""One ``parity bisect`` from its settings to its report: the bisection (or the sweep), the log, and the history
report. The CLI builds the settings, the baseline's rows, the installer and the measure; a test hands in its own."""

from __future__ import annotations

import json
from typing import Callable

import pandas as pd

from harness.core.results import atomic_write_text
from harness.report import bisect_report

from .history import JUDGED, History, crossings, repro


def bisect(history: History, repro_extra: tuple[str, ...] = ()) -> dict:
    """Run the settings' mode; write the log, ``bisect.json`` and the report; return what was found: the
    comparisons' table (every version measured), the crossings, and the versions no comparison could judge."""
    s = history.settings
    s.out.mkdir(parents=True, exist_ok=True)
    order = [v.name for v in history.active()]
    if s.sweep:
        table = history.sweep()
        found = crossings(table, order)
        mode = "all"
    else:
        found = history.bisect()
        table = pd.concat(list(history.verdicts.values()), ignore_index=True)
        mode = "bisect"
    judged = table[table["verdict"].isin(JUDGED)][["case_id", "tensor"]].drop_duplicates()
    if len(judged):  # comparisons no version judged (a forward-only candidate's gradients) are left out
        table = table.merge(judged, on=["case_id", "tensor"])
    for c in found:
        c.repro = repro(s, c, repro_extra) if c.after else ""
    history.write_log()
    versions = []
    for v in s.versions:
        state = dict(history.states.get(v.name, {}))
        if v.name in s.skip:
            state = {"state": "skipped", "reason": "--skip"}
        versions.append({**v.record(), **{k: state[k] for k in ("state", "reason") if k in state}})
    judged_at = set(table.loc[table["verdict"].isin(JUDGED), "version"])  # a version whose every case errored too
    unjudged = [v["version"] for v in versions if v.get("state") in ("refused", "unsupported", "install_failed",
                                                                     "run_failed", "skipped")
                or (v["version"] in set(table["version"]) and v["version"] not in judged_at)]
    records = [dict(c.record(), repro=c.repro) for c in found]
    ran = sum(v.get("state") in ("installed", "unsupported", "run_failed") for v in versions)
    what = (f"{'Every version' if mode == 'all' else 'Bisection over'} {order[0]} .. {order[-1]} "
            f"({len(order)} versions, {ran} installed and run) of {s.leg}, "
            f"{table[['case_id', 'tensor']].drop_duplicates().shape[0]} comparisons (case × tensor) judged by the "
            f"gate against one set of {s.baseline_leg} rows. Versions not judged: {', '.join(unjudged) or 'none'}.")
    meta = {"leg": s.leg, "baseline_leg": s.baseline_leg, "mode": mode, "what": what,
            "command": "parity bisect " + " ".join(_quote(a) for a in s.argv), "notes": list(s.notes)}
    paths = bisect_report.write(s.out, table, versions, records, meta)
    atomic_write_text(s.out / "bisect.json", json.dumps({"leg": s.leg, "package": s.package, "mode": mode,
                                                         "versions": versions, "argv": list(s.argv),
                                                         "notes": list(s.notes)}, indent=1) + "\n")
    history.say(f"bisect: {what}")
    for line in bisect_report.sentences(records, mode)[:20]:
        history.say("  " + line.replace("\n", "\n  "))
    history.say(f"bisect: -> {', '.join(map(str, paths))}; log {history.log_path}")
    return {"table": table, "crossings": found, "unjudged": unjudged, "versions": versions}


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def read_log(text: str) -> tuple[list[str], dict]:
    """A bisect log's arguments and marks (the last ``good``/``bad`` win; ``skip`` lines add up): a ValueError of
    one line when it has no ``args`` line."""
    argv, marks = None, {"good": None, "bad": None, "skip": []}
    for n, line in enumerate(text.splitlines(), 1):
        word, _, rest = line.strip().partition(" ")
        if word == "args":
            try:
                argv = json.loads(rest)
            except ValueError:
                raise ValueError(f"bisect log line {n}: the args are not a JSON list") from None
        elif word in ("good", "bad") and rest.strip() and " " not in rest.strip():
            marks[word] = rest.strip()
        elif word == "skip" and rest.strip() and " " not in rest.strip():
            marks["skip"].append(rest.strip())
    if not isinstance(argv, list):
        raise ValueError("not a parity bisect log: no 'args [...]' line")
    return argv, marks


Say = Callable[[str], None]
