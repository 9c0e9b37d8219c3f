"""fla's own op tests translated into case files (``cases/fla-tests/*.toml``): each file reads through the cases-file
reader into exactly the number of cases its header comment states (``(N cases``), every case id reads back to the
same case, and no case is refused where the file does not say so.

Refusals are checked on every case (all files together take a few seconds: the TPU kernels are asked by tracing
on shape-only inputs, nothing runs): no kernel binding (``OpDescriptor.binding_refusals``: fla's and the Pallas
binding's own limits) and no TPU kernel (``harness.legs.tpu.kernel_refusal``) refuses one, and the recurrent
float64 reference (the reference leg's default) refuses exactly the cases whose ``[[case]]`` line the file marks
``--ref-method chunk``.
"""

import re
from pathlib import Path

import pytest

from cases.case import Case
from harness.app import load_cases
from harness.legs.ref import RefLeg
from harness.legs.tpu import kernel_refusal
from harness.ops import get_op

from case_files import header as _header

FLA_TESTS = Path(__file__).resolve().parent.parent / "cases" / "fla-tests"
FILES = sorted(FLA_TESTS.glob("*.toml"))
COUNT = re.compile(r"\((\d+) cases\b")
REF_MARKED = re.compile(r'(?m)^\[\[case\]\][^\n]*--ref-method chunk[^\n]*\nid = "([^"]+)"')


def test_the_four_translated_files_are_there():
    assert {p.stem for p in FILES} >= {"gdn", "kda", "simple_gla", "gla"}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_case_count_matches_the_header(path):
    stated = COUNT.findall(_header(path))
    assert stated, f"{path.name}: the header comment states no '(N cases'"
    assert len(load_cases(path)) == int(stated[0])


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_case_id_round_trips(path):
    for case in load_cases(path):
        assert Case.from_id(case.id, ops=get_op) == case, case.id


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_no_case_is_refused_unless_the_file_says_so(path):
    ref = RefLeg()
    marked = set(REF_MARKED.findall(path.read_text()))
    refused_by_ref = set()
    for case in load_cases(path):
        op = get_op(case.op)
        assert op.binding_refusals(case) == {}, case.id
        assert kernel_refusal(op, case) is None, case.id
        why = ref.supports(op, case)
        if why:
            assert "--ref-method chunk" in why, (case.id, why)
            refused_by_ref.add(case.id)
    assert refused_by_ref == marked
