"""The peer bindings' shared mapping helpers (peers/mapping.py), on hand-made values."""

import numpy as np
import pytest

from cases.case import Case
from peers.mapping import SlotWritten, check_kept, requests

CASE = "gdn.fused_recurrent/B1-T24-H2-HV4-K128-V128/bf16/g=logsigmoid/16/C64/{lens}h0"


def test_requests_are_the_packed_sequences_or_the_batch_rows():
    assert requests(Case.from_id(CASE.format(lens="lens=1+3+20,"))) == ((0, 1, 4, 24), [1, 3, 20])
    batched = Case.from_id("gdn.chunk/B3-T5-H1-K128-V128/bf16/g=logsigmoid/16/C64/h0")
    assert requests(batched) == ((0, 5, 10, 15), [5, 5, 5])


def test_kept_slots_pass_bit_for_bit_nan_included():
    pool = np.array([[1.0, np.nan], [0.0, 2.0]], np.float32)
    check_kept(pool, pool.copy(), [4, 7], "state")  # the same bits, NaN's too: nothing raised


@pytest.mark.parametrize("changed, change", [(-0.0, "0"),  # a sign bit alone is a write
                                             (np.float32(2.0) + np.float32(2.0 ** -22), "2.38e-07")])
def test_a_changed_bit_names_its_slot_and_the_change(changed, change):
    expected = np.array([[1.0, 3.0], [0.0, 2.0]], np.float32)
    got = expected.copy()
    got[1, 1 if changed else 0] = changed if changed else -0.0
    with pytest.raises(SlotWritten, match=rf"state: slot\(s\) \[7\] changed .*7: {change}\)"):
        check_kept(expected, got, [4, 7], "state")


def test_a_pool_of_another_shape_or_dtype_is_named():
    with pytest.raises(SlotWritten, match=r"came back as float64\[2, 2\], not float32\[2, 2\]"):
        check_kept(np.zeros((2, 2), np.float32), np.zeros((2, 2)), [1, 2], "state")
