"""Cases across worker processes (harness.app.workers, ``--jobs N``): the same rows in the same order at any N,
no worker for what the caches serve, and a worker that dies is error rows, never an abort (more faults:
tests/test_faults.py)."""

import pandas as pd
import pytest

from harness.cli import main
from harness.app.workers import default_jobs, parse_jobs
from harness.core.memory import GIB_PER_JOB
from faults import FAULTY

SIMPLE_GLA = ["--suite", "smoke", "--op", "simple_gla"]
VOLATILE = {"timestamp", "wall_s", "details"}  # when a row was made and how long it took; served rows say so


@pytest.fixture
def sent(monkeypatch) -> list[int]:
    """Test side: how many cases each command sent to its workers, one entry per command (as its pool closes)."""
    import harness.app.workers as workers

    counts = []
    real = workers.Workers.close

    def close(self, wait=True):
        counts.append(self.sent)
        real(self, wait)

    monkeypatch.setattr(workers.Workers, "close", close)
    return counts


def test_default_jobs_on_hand_computed_machines():
    assert GIB_PER_JOB == 4
    assert default_jobs({}, cpus=2, memory_gib=24) == 2  # this CI machine: the CPUs decide
    assert default_jobs({}, cpus=16, memory_gib=24) == 6  # 24 GiB // 4 GiB
    assert default_jobs({}, cpus=8, memory_gib=3.9) == 1  # never fewer than one
    assert default_jobs({"PARITY_JOBS": "3"}, cpus=2, memory_gib=24) == 3  # the user's word wins
    assert default_jobs({"PARITY_JOBS": ""}, cpus=2, memory_gib=24) == 2  # empty: unset
    for bad in ("0", "-1", "two", "1.5"):
        with pytest.raises(ValueError, match="at least 1"):
            parse_jobs(bad)
    with pytest.raises(ValueError, match="PARITY_JOBS"):
        default_jobs({"PARITY_JOBS": "0"})


def _result(out, leg: str) -> pd.DataFrame:
    [path] = out.glob(f"{leg}.op-simple_gla.csv")
    return pd.read_csv(path, keep_default_na=False)


def _stable(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=[c for c in df.columns if c in VOLATILE])


@pytest.mark.heavy  # whole commands through real legs, cold and warm, at --jobs 1 and 2: pytest -m heavy (.ci/run)
@pytest.mark.needs_leg("ref")
def test_two_jobs_give_the_rows_of_one_in_case_order(tmp_path, monkeypatch, capsys, sent):
    frames = {}
    for jobs in ("1", "2"):
        monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / f"cache{jobs}"))  # cold: every case runs
        out = tmp_path / f"out{jobs}"
        assert main(["run", "--backend", "ref", *SIMPLE_GLA, "--out", str(out), "--no-progress", "--jobs", jobs]) == 0
        assert main(["causality", "--backend", "ref", *SIMPLE_GLA, "--out", str(out), "--no-progress",
                     "--jobs", jobs]) == 0
        frames[jobs] = (_result(out, "ref"), pd.read_csv(out / "causality-ref.op-simple_gla.csv",
                                                         keep_default_na=False))
    one, two = frames["1"], frames["2"]
    assert len(one[0]) > 10 and one[0]["case_id"].nunique() > 3
    assert list(two[0]["case_id"]) == list(one[0]["case_id"])  # case order, whatever finished first
    pd.testing.assert_frame_equal(_stable(two[0]), _stable(one[0]))
    pd.testing.assert_frame_equal(_stable(two[1]), _stable(one[1]))
    cases = one[0]["case_id"].nunique()
    assert sent[:2] == [0, 0]  # --jobs 1 starts no worker
    assert sent[2] == cases and sent[3] > 0  # cold, at 2: every case ran in a worker

    # warm: the caches serve every case and every causality run, and no worker starts
    out = tmp_path / "warm"
    assert main(["run", "--backend", "ref", *SIMPLE_GLA, "--out", str(out), "--no-progress", "--jobs", "2"]) == 0
    assert main(["causality", "--backend", "ref", *SIMPLE_GLA, "--out", str(out), "--no-progress",
                 "--jobs", "2"]) == 0
    assert sent[4:] == [0, 0]
    assert f"{cases}/{cases} cases from the baseline cache" in capsys.readouterr().out
    pd.testing.assert_frame_equal(_stable(_result(out, "ref")), _stable(two[0]))


DYING = FAULTY  # every case exits (FAULT=exit, FAULT_DTYPES below): a worker killed for memory looks the same


@pytest.mark.needs_leg("tpu")
def test_a_worker_that_dies_is_error_rows(tmp_path, monkeypatch):
    from harness.legs import registry

    (tmp_path / "dying_impl.py").write_text(DYING)
    monkeypatch.setenv("FAULT", "exit")
    monkeypatch.setenv("FAULT_DTYPES", "bfloat16,float32")
    monkeypatch.syspath_prepend(str(tmp_path))  # the workers inherit the parent's path
    monkeypatch.setattr(registry, "_LEGS", {spec.name: spec for spec in registry.BUILTIN})
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "cache"))
    cases = ["simple_gla.chunk/B1-T64-H1-K64-V64/bf16/g=logsigmoid/16/C64",
             "simple_gla.chunk/B1-T64-H1-K64-V64/fp32/g=logsigmoid/16/C64"]
    out = tmp_path / "out"
    code = main(["run", "--backend", "dying", "--impl", "dying=dying_impl:IMPLEMENTATION",
                 *[a for c in cases for a in ("--case", c)], "--out", str(out), "--no-progress", "--jobs", "2",
                 "--tpu-targets", "v6e"])
    assert code == 4  # lost cases, not a parity violation (docs/faults.md)
    [path] = out.glob("dying.cases-*.csv")
    rows = pd.read_csv(path, keep_default_na=False)
    assert list(rows.drop_duplicates("case_id")["case_id"]) == cases
    assert set(rows["status"]) == {"error"}
    # "ended": the worker registered --impl again and ran the kernel; an unknown leg would have "failed"
    assert rows["reason"].str.contains(r"lost: its process ended \(exit code 7\)").all(), rows["reason"].tolist()


class _FakeWorker:
    """Test side: a worker with no process; its case's rows are the name of the worker that took it."""

    def __init__(self, context, log_dir):
        import types

        self.name = f"w{len(_FakeWorker.started)}"
        _FakeWorker.started.append(self)
        self.conn = types.SimpleNamespace(send=lambda message: None)
        self.future, self.deadline, self.seen = None, float("inf"), set()

    def stop(self):
        pass


def _fake_poll(pool):
    """Every busy worker answers at once, its rows the worker's name."""
    for w in pool._workers:
        if w.future is not None:
            future, w.future = w.future, None
            future.set_result(([{"worker": w.name}], 0, 0))


def test_a_case_goes_back_to_the_worker_that_held_it(monkeypatch):
    """A second pass of one command (the causality pass after a leg's) sends each case to the worker whose
    programs it compiled, taking a later waiting case when that worker is busy, and hands the rows on in case
    order."""
    import types

    import harness.app.workers as workers
    from harness.app.selection import case_from_id

    _FakeWorker.started = []
    monkeypatch.setattr(workers, "_Worker", _FakeWorker)
    monkeypatch.setattr(workers._Pool, "poll", _fake_poll)
    cases = {n: case_from_id(f"simple_gla.chunk/B1-T{64 + n}-H1-K64-V64/fp32/g=logsigmoid/16/C64") for n in range(6)}
    runner = types.SimpleNamespace(leg_cache=None)
    job = workers._Walk(0, types.SimpleNamespace(task="causality"), ())
    pool = workers.Workers(jobs=2)

    def walk(order):
        got = []
        pool._run_pooled(runner, job, [cases[n] for n in order], lambda case, rows: got.append((case, rows)),
                         at_once=2, timeout=60.0)  # a time limit: no case is settled in the parent
        assert [case for case, _ in got] == [cases[n] for n in order]  # case order
        return {n: rows[0]["worker"] for n, (_, rows) in zip(order, got)}

    first = walk(range(6))
    assert first == {0: "w0", 1: "w1", 2: "w0", 3: "w1", 4: "w0", 5: "w1"}
    # 0 and 2 were w0's: 0 goes to w0, so w1 takes 3 (its own) ahead of 2, and 2 waits for w0
    second = walk([0, 2, 3, 5])
    assert second == {n: first[n] for n in (0, 2, 3, 5)}
    assert len(_FakeWorker.started) == 2  # the pool's workers served both passes
    # without the walk's choice (every waiting case ranked alike: the oldest first), 2 would have gone to w1
    monkeypatch.setattr(workers._Pool, "rank", lambda self, case: 1)
    assert walk([0, 2])[2] == "w1"


@pytest.mark.heavy  # whole commands through real legs, cold and warm, at --jobs 1 and 2: pytest -m heavy (.ci/run)
@pytest.mark.needs_leg("tpu")
def test_compile_workers_give_the_rows_of_one_and_a_dead_one_is_error_rows(tmp_path, monkeypatch, sent):
    """``parity compile --jobs 2`` sends every case to a worker (a compile keeps one core busy) and writes the rows
    of ``--jobs 1`` in case order; a worker that dies is one error row per target."""
    from harness.legs import registry

    cases = ["simple_gla.chunk/B1-T64-H1-K64-V64/bf16/g=logsigmoid/16/C64",
             "simple_gla.chunk/B1-T64-H1-K64-V64/bf16/g=logsigmoid/16/C24",  # refused: C not a multiple of 16
             "simple_gla.chunk/B1-T64-H1-K64-V64/fp32/g=logsigmoid/16/C64"]
    selection = [a for c in cases for a in ("--case", c)]
    frames = []
    for jobs in ("1", "2"):
        out = tmp_path / f"out{jobs}"
        assert main(["compile", *selection, "--target", "v6e", "--out", str(out), "--no-progress",
                     "--jobs", jobs]) == 0
        frames.append(pd.read_csv(out / "compile.csv", keep_default_na=False).drop(columns=["compile_s", "timestamp"]))
    assert list(frames[1]["case_id"]) == cases
    assert list(frames[1]["status"]) == ["ok", "unsupported", "ok"]
    pd.testing.assert_frame_equal(frames[1], frames[0])
    assert sent == [0, len(cases)]

    (tmp_path / "dying_impl.py").write_text(DYING)
    monkeypatch.setenv("FAULT", "exit")
    monkeypatch.setenv("FAULT_DTYPES", "bfloat16,float32")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_LEGS", {spec.name: spec for spec in registry.BUILTIN})
    out = tmp_path / "dying"
    assert main(["compile", "--backend", "dying", "--impl", "dying=dying_impl:IMPLEMENTATION", "--case", cases[0],
                 "--target", "v6e,v7x", "--out", str(out), "--no-progress", "--jobs", "2"]) == 4
    rows = pd.read_csv(out / "compile.dying.csv", keep_default_na=False)
    assert list(rows["target"]) == ["v6e", "v7x"] and set(rows["status"]) == {"error"}
    assert rows["reason"].str.contains(r"its process ended \(exit code 7\)").all(), rows["reason"].tolist()
