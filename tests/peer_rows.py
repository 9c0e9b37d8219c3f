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
