"""What a binding author needs (issue 48): the minimal binding of docs/legs.md runs as printed, ``parity cases
--inputs`` lists what a binding receives, repro lines of an ``--impl`` leg carry the ``--impl``, a failed
preflight keeps the emulated run's numbers beside its error, ``parity all`` checks a candidate's causality, and
the compile summary counts every row's time."""

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cases.case import Case, Gate
from harness import app, cli
from harness.app import case_from_id
from harness.legs import registry
from harness.legs.base import Environment, Leg, LegOutput
from harness.run.reference_cache import ReferenceCache
from harness.report.compile_lines import compile_seconds
from harness.run.runner import Runner, repro

DOC = Path(__file__).resolve().parent.parent / "docs" / "legs.md"
CASE = "simple_gla.chunk/B1-T64-H2-K64-V64/bf16/g=logsigmoid/16/C64"
PACKED = "simple_gla.chunk/B1-T64-H2-K64-V64/bf16/g=logsigmoid/16/C64/lens=37+27"


def _doc_blocks():
    """The minimal binding's code (the python block after "**A minimal binding.**") and its command."""
    text = DOC.read_text()
    section = text.split("**A minimal binding.**", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    command = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return code, " ".join(command.replace("\\\n", " ").split())


@pytest.fixture
def fresh_registry(monkeypatch):
    monkeypatch.setattr(registry, "_LEGS", {spec.name: spec for spec in registry.BUILTIN})
    monkeypatch.setattr(registry, "_entry_points_loaded", False)


@pytest.fixture
def doc_binding(tmp_path, monkeypatch, fresh_registry):
    """docs/legs.md's minimal binding saved as my_binding.py on the path, as the doc says to."""
    code, command = _doc_blocks()
    (tmp_path / "my_binding.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    return command


def test_the_docs_minimal_binding_loads_refuses_and_traces(doc_binding):
    import jax

    assert doc_binding.startswith("PYTHONPATH=. parity run --backend mine --impl mine=my_binding:IMPLEMENTATION")
    assert f"--case '{CASE}'" in doc_binding
    name, target = registry.parse_impl("mine=my_binding:IMPLEMENTATION")
    registry.register_implementation(name, target)
    impl = registry.load_implementation(name, target)
    binding = impl.bindings["simple_gla"]
    assert not binding.differentiable
    case, packed = case_from_id(CASE), case_from_id(PACKED)
    assert binding.supports(case) is None
    assert binding.supports(packed) == "my library does not take packed sequences"
    from harness.legs.external import ExternalLeg

    leg = ExternalLeg(name, target)
    from harness.ops import get_op

    op = get_op("simple_gla")
    assert leg.supports(op, case) is None  # the leg's own refusal check traces the doc's forward
    assert leg.supports(op, packed) == "my library does not take packed sequences"
    structs = {n: jax.ShapeDtypeStruct(s, d) for n, s, d in app.binding_inputs(op, case)[1]}
    out = jax.eval_shape(lambda a: binding.forward(case, a, None), structs)
    assert out["o"].shape == (1, 64, 2, 64)


@pytest.mark.heavy
def test_the_docs_minimal_binding_runs_as_printed(doc_binding, tmp_path):
    """The doc's command (its backend, --impl and case), plus a packed case its binding refuses."""
    args = doc_binding.split("parity ", 1)[1].replace(f"'{CASE}'", CASE).split()
    assert cli.main([*args, "--case", PACKED, "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    [path] = (tmp_path / "out").glob("mine.cases-*.csv")
    rows = pd.read_csv(path).set_index(["case_id", "tensor"])
    plain, packed = rows.loc[CASE], rows.loc[PACKED]
    assert (plain.loc[["o", "ht"], "status"] == "ok").all() and (plain.loc[["o", "ht"], "rel_l2"] < 1e-2).all()
    assert (plain.loc[["dq", "dk", "dv", "dg"], "status"] == "not_provided").all()
    assert plain.loc["o", "kernels_traced"] == plain.loc["o", "kernels_mosaic"] > 0
    assert (packed["status"] == "unsupported").all()
    assert plain.loc["o", "repro"] == f"parity run --backend mine --impl mine=my_binding:IMPLEMENTATION --case '{CASE}'"


def test_cases_inputs_lists_what_a_binding_receives(capsys):
    case = "gdn.chunk/B1-T64-H2-K64-V64/bf16/g=logsigmoid/16/C64/h0,dht,state_v_first"
    assert cli.main(["cases", "--inputs", "--case", case]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(case + "\t")
    got = {ln.split("\t")[0].strip(): tuple(ln.split("\t")[1:3]) for ln in lines[1:]}
    assert got == {"q": ("[1, 64, 2, 64]", "bfloat16"), "k": ("[1, 64, 2, 64]", "bfloat16"),
                   "v": ("[1, 64, 2, 64]", "bfloat16"), "g": ("[1, 64, 2]", "float32"),
                   "beta": ("[1, 64, 2]", "bfloat16"), "do": ("[1, 64, 2, 64]", "bfloat16"),
                   "h0": ("[1, 2, 64, 64]", "float32"), "dht": ("[1, 2, 64, 64]", "float32")}


def test_repro_of_an_impl_leg_names_its_impl(fresh_registry):
    registry.register_implementation("mine", "my_pkg.parity:IMPLEMENTATION")
    assert repro("mine", "X") == "parity run --backend mine --impl mine=my_pkg.parity:IMPLEMENTATION --case 'X'"
    assert repro("tpu", "X") == "parity run --backend tpu --case 'X'"
    assert repro("not-registered", "X") == "parity run --backend not-registered --case 'X'"


class _CompilesNot(Leg):
    """A candidate whose run gives the golden times (1 + 1e-3) and whose preflight (the compile) fails."""

    name = "tpu"

    def __init__(self):
        self.cache = ReferenceCache(None)

    def environment(self):
        return Environment(mode="emulated", device="fake", versions={"libtpu": "fake"})

    def supports(self, op, case):
        return None

    def preflight(self, op, case, inputs):
        return "does not compile for TPU v6e: MosaicError: no", {"compiled_for": ""}

    def run(self, op, case, inputs):
        return LegOutput({n: v * (1 + 1e-3) for n, v in self.cache.get(op, case, inputs).items()}, {})


def test_a_failed_compile_keeps_the_emulated_numbers_beside_its_error():
    case = Case("simple_gla", "chunk", B=1, T=16, H=2, K=8, V=8, dtype="float32", gate=Gate(), chunk_size=8)
    rows = Runner(_CompilesNot(), ReferenceCache(None)).run_case(case)
    assert {r["status"] for r in rows} == {"error"}
    for r in rows:
        assert r["reason"].startswith("does not compile for TPU v6e: MosaicError: no [the emulated run gave rel_l2 ")
        assert r["reason"].endswith("(within its bound)]")
        assert r["rel_l2"] == pytest.approx(1e-3, rel=1e-3)


def test_all_checks_a_candidates_causality_unless_told_not_to(monkeypatch, tmp_path):
    """``parity all``'s legs stage (harness.app.session.Run.legs_stage) runs each leg's causality check unless the
    settings say not (``--no-causality``); the legs themselves are replaced here from the test side by rows made
    here."""
    from harness.app.session import Run
    from harness.app.settings import RunSettings

    ran = []
    frame = pd.DataFrame({"status": ["ok"]})

    def leg(run, name, cases=None, path=None):
        run.frames[name], run.paths[name] = frame, tmp_path / f"{name}.csv"
        return frame

    monkeypatch.setattr(Run, "leg", leg)
    monkeypatch.setattr(Run, "causality", lambda run, name, cases=None: ran.append(name) or frame)
    for causality in (True, False):
        with Run(RunSettings(out=tmp_path, progress=False, causality=causality)) as run:
            assert run.legs_stage([("theirs", None), ("absent", "not installed here")]) == 0
    assert ran == ["theirs"]
    assert cli.build_parser().parse_args(["all", "--no-causality"]).no_causality  # the option the front reads


def test_the_compile_summary_counts_failed_rows_time():
    part = pd.DataFrame({"status": ["error", "error", "ok"], "compile_s": [3.8, 4.6, 1.0],
                         "reused_from": [None, None, "record.csv"]})
    assert compile_seconds(part) == "8.4 s compiling (1 rows reused)"
    assert compile_seconds(part.iloc[:2]) == "8.4 s compiling"
