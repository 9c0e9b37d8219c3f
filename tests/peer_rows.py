"""Checks the peer binding tests share (tests/test_peer_*.py) on a candidate's rows."""


def assert_forward_only(rows, mapped, forward=("o", "ht")):
    """Every compared tensor of the mapped cases but the forward ones is ``not_provided`` (and there are some)."""
    grads = rows[rows.case_id.isin(mapped) & ~rows.tensor.isin(list(forward))]
    assert len(grads) and (grads.status == "not_provided").all()


def assert_refused(rows, case, why):
    """Every row of ``case`` is ``unsupported``, its reason containing ``why``."""
    mine = rows[rows.case_id == case]
    assert len(mine) and (mine.status == "unsupported").all()
    assert mine.reason.str.contains(why, regex=False).all(), mine.reason.iloc[0]


def assert_compile_refused_finding(tmp_path, backend, case, mosaic_says):
    """A finding of the kind "does not compile for TPU v6e": ``parity run --backend BACKEND --case CASE`` exits 1
    and every row of the case is an ``error`` (which the gate fails, closed) whose reason quotes Mosaic's words and
    keeps the emulated run's numbers."""
    import pandas as pd

    from harness.cli import main

    assert main(["run", "--backend", backend, "--case", case, "--out", str(tmp_path), "--no-progress",
                 "--tpu-targets", "v6e"]) == 1
    rows = pd.read_csv(next(tmp_path.glob(f"{backend}.cases-*.csv")))
    assert len(rows) and (rows.status == "error").all()
    assert rows.reason.str.contains(f"does not compile for TPU v6e: {mosaic_says} [the emulated run gave",
                                    regex=False).all(), rows.reason.iloc[0]
