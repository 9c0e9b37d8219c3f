"""The committed records that stand for CI's two long sweeps (docs/ci.md, "Verified by content") still stand for
this checkout.

A record whose key no longer matches is not wrong, only stale: CI then runs the sweep for real, which is correct but
costs ten minutes and breaks CI's time budget (this happened at an edit of ``harness/run/runner.py``, a compile source).
These tests say so at ``pytest`` time, with the command that refreshes the record, instead of an hour later in CI.
Each record is checked only on the stack it was made on (its versions are part of its key)."""

import json
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
COMPILE_RECORDS = sorted((ROOT / "reports/ci/compile").glob("*.csv.gz"))
PTX_RECORD = ROOT / "reports/ci/ptx-smoke"


def _stale_compile_rows(record: Path) -> tuple[list[str], int] | None:
    """The ``case [target]`` of every ``ok`` row of ``record`` whose content key this checkout would not give,
    and how many ``ok`` rows there are; None when the record was made on another stack than the installed one."""
    from harness.app import case_from_id
    from harness.probes.compile_cases import ContentKeys
    from harness.legs import default_leg, make_leg
    from harness.run.reference_cache import ReferenceCache
    from harness.run.runner import Runner
    from harness.compile.tpu_compile import versions

    df = pd.read_csv(record, dtype=str, keep_default_na=False)
    installed = versions()
    if any(set(df[name]) != {installed[name]} for name in ("jax", "jaxlib", "libtpu")):
        return None
    runner = Runner(make_leg(default_leg("candidate"), compile_targets=()), ReferenceCache(None))
    keys = ContentKeys(runner.leg)
    ok = df[df["status"] == "ok"]
    stale = []
    for row in ok.itertuples():
        case = case_from_id(row.case_id)
        if keys(runner.op_of(case), case, row.target) != row.content_key:
            stale.append(f"{row.case_id} [{row.target}]")
    return stale, len(ok)


@pytest.mark.parametrize("record", COMPILE_RECORDS, ids=[p.name for p in COMPILE_RECORDS])
def test_the_committed_compile_record_stands_for_this_checkout(record):
    found = _stale_compile_rows(record)
    if found is None:
        pytest.skip(f"{record.name} was made on another stack (jax, jaxlib, libtpu) than the installed one")
    stale, ok = found
    assert ok > 0, f"{record.name} holds no ok row to reuse"
    assert not stale, (f"{len(stale)} of {ok} ok rows of {record.relative_to(ROOT)} no longer match this checkout "
                       f"(first: {stale[0]}): a compile source or a kernel moved; refresh the record with the "
                       "commands of docs/ci.md, 'Verified by content'")


def test_the_committed_ptx_record_stands_for_this_checkout():
    pytest.importorskip("triton", reason="the PTX record is fla's GPU leg's: a TPU-side install has no triton")
    pytest.importorskip("torch", reason="the PTX record is fla's GPU leg's: a TPU-side install has no torch")
    from harness.app.ptx_leg import leg_inputs as ptx_leg_inputs
    from harness.emulation import ptx

    key = json.loads((PTX_RECORD / "key.json").read_text())
    selection, targets = key["inputs"]["selection"], key["inputs"]["targets"]
    assert selection[0] == "--suite", f"the record's selection {selection} is not a suite"
    current = ptx.content_key(selection, targets, leg_inputs=ptx_leg_inputs("gpu", selection[1], []))
    if current["inputs"]["versions"] != key["inputs"]["versions"]:
        pytest.skip("the PTX record was made on another stack (triton, fla, torch) than the installed one")
    moved = ptx.input_differences(key["inputs"], current["inputs"])
    assert current["key"] == key["key"], (f"the PTX record no longer matches this checkout ({', '.join(moved[:5])} "
                                          "moved): refresh it with the command of docs/ci.md, 'Verified by content'")
