"""The CI gates: ``pytest -m gpu`` and ``pytest -m tpu``, one test per suite case.

On a GPU machine ``pytest -m gpu`` runs fla natively and writes gpu.csv; on a
TPU machine ``pytest -m tpu --gpu-results gpu.csv`` runs the Pallas kernels
and enforces eps_TPU <= eps_GPU. Without the hardware both run emulated.
"""

import pytest

import pandas as pd

from harness.app import gate_case
from harness.run.runner import FAILING_STATUSES


def _failures(rows):
    return [f"{r['tensor']}: {r['status']} {r['reason']}" for r in rows if r["status"] in FAILING_STATUSES]


@pytest.mark.gpu
def test_gpu_leg(parity_case, parity_runner, parity_results):
    rows = parity_runner("gpu").run_case(parity_case)
    parity_results.add("gpu", rows)
    assert not _failures(rows), f"{parity_case.id}: {_failures(rows)}\nrepro: {rows[0]['repro']}"


@pytest.mark.tpu
def test_tpu_leg_against_gpu(parity_case, parity_runner, parity_results, gpu_baseline, parity_policy,
                             parity_candidate):
    """The candidate (this project's kernels, or --parity-candidate) against the GPU rows of the case."""
    result, rows = gate_case(parity_case, parity_runner(parity_candidate).run_case, gpu_baseline, parity_policy,
                             parity_candidate)
    parity_results.add(parity_candidate, rows)
    fails = [f"{r['tensor']} {r['metric']}: {r['verdict']}: {r['reason']}"
             for r in pd.concat([result.failures, result.inconclusive]).to_dict("records")]
    assert not fails, f"{parity_case.id}: {fails}\nrepro: {rows[0]['repro']}"
