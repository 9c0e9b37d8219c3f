"""tops' own op tests translated into case files (``cases/tops-tests/*.toml``, issue 36): each file reads through the
cases-file reader into exactly the number of cases its header states (``translated into cases: N cases``), every
case id reads back to the same case, and each leg refuses exactly what the header says.

The header lists each refusal as ``#   <leg> leg (<count>): "<fragment of the reason>"``: the GPU leg's (the fla
binding's own ``supports``) and the TPU leg's (the Pallas binding's ``supports``, then the kernels themselves, asked
by tracing on shape-only inputs: ``harness.legs.tpu.kernel_refusal``). Every refusal of a case must contain one
listed fragment of its leg, and each fragment must cover its count of cases, no more, no fewer. The recurrent float64
reference (the reference leg's default) refuses exactly the cases whose ``[[case]]`` line says ``--ref-method chunk``.
"""

import collections
import re
from pathlib import Path

import pytest

from cases.case import Case
from harness.app import load_cases
from harness.legs.ref import RefLeg
from harness.legs.tpu import kernel_refusal
from harness.ops import get_op

from case_files import header as _header

TOPS_TESTS = Path(__file__).resolve().parent.parent / "cases" / "tops-tests"
FILES = sorted(TOPS_TESTS.glob("*.toml"))
COUNT = re.compile(r"translated into cases: (\d+) cases\b")
REFUSED = re.compile(r'(?m)^#\s+(gpu|tpu) leg \((\d+)\): "([^"]+)"$')
REF_MARKED = re.compile(r'(?m)^\[\[case\]\][^\n]*--ref-method chunk[^\n]*\nid = "([^"]+)"')


def test_the_three_translated_files_are_there():
    assert {p.stem for p in FILES} >= {"simple_gla", "gla", "kda"}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_case_count_matches_the_header(path):
    stated = COUNT.findall(" ".join(_header(path).replace("#", " ").split()))
    assert stated, f"{path.name}: the header states no 'translated into cases: N cases'"
    assert len(load_cases(path)) == int(stated[0])


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_case_id_round_trips(path):
    for case in load_cases(path):
        assert Case.from_id(case.id, ops=get_op) == case, case.id


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_each_leg_refuses_what_the_header_says(path):
    declared = {(leg, fragment): int(n) for leg, n, fragment in REFUSED.findall(_header(path))}
    counted = collections.Counter()
    ref, marked, refused_by_ref = RefLeg(), set(REF_MARKED.findall(path.read_text())), set()
    for case in load_cases(path):
        op = get_op(case.op)
        for leg, why in (("gpu", op.fla.supports(case)), ("tpu", op.pallas.supports(case) or kernel_refusal(op, case))):
            if why:
                match = [key for key in declared if key[0] == leg and key[1] in why]
                assert match, f"{path.name}: {case.id}: the {leg} leg refuses it, the header does not say so: {why}"
                counted[match[0]] += 1
        why = ref.supports(op, case)
        if why:
            assert "--ref-method chunk" in why, (case.id, why)
            refused_by_ref.add(case.id)
    assert dict(counted) == {key: n for key, n in declared.items() if n}, path.name
    assert refused_by_ref == marked
