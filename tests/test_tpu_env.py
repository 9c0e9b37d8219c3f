"""A silent start: libtpu's defaults (harness.compile.tpu_env) and a clean stderr from a real command."""

import os
import subprocess
import sys

from harness.compile.tpu_env import MOSAIC_DUMP_OWNER, WITHOUT_A_TPU, prepare_environment, tpu_attached


def test_defaults_without_a_tpu_keep_what_the_user_set(tmp_path):
    none = (str(tmp_path / "accel[0-9]*"),)
    env = {"TPU_ACCELERATOR_TYPE": "v5litepod-8"}
    prepare_environment(env, none)
    dump = env.pop("LIBTPU_INIT_ARGS")  # Mosaic's passes dumped for the compile's MXU check (test_mosaic_dump.py)
    assert dump.startswith("--xla_mosaic_dump_to=") and env.pop(MOSAIC_DUMP_OWNER) == str(os.getpid())
    assert env == {"TPU_ACCELERATOR_TYPE": "v5litepod-8", "TPU_WORKER_HOSTNAMES": "localhost",
                   "ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "TPU_SKIP_MDS_QUERY": "1"}


def test_an_empty_variable_is_not_a_value(tmp_path):
    """``TPU_ACCELERATOR_TYPE=`` (set, empty) is no topology: the silent start's value is put in its place."""
    env = {"TPU_ACCELERATOR_TYPE": "", "TPU_WORKER_HOSTNAMES": "hosta"}
    prepare_environment(env, (str(tmp_path / "accel[0-9]*"),))
    assert env["TPU_ACCELERATOR_TYPE"] == WITHOUT_A_TPU["TPU_ACCELERATOR_TYPE"]
    assert env["TPU_WORKER_HOSTNAMES"] == "hosta"


def test_a_machine_with_a_tpu_gets_no_topology(tmp_path):
    (tmp_path / "accel0").touch()
    chips = (str(tmp_path / "accel[0-9]*"),)
    assert tpu_attached(chips) and not tpu_attached((str(tmp_path / "vfio" / "[0-9]*"),))
    env = {}
    prepare_environment(env, chips)
    assert not set(WITHOUT_A_TPU) & set(env) and env["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "1"
    assert "LIBTPU_INIT_ARGS" not in env  # native runs compile every program: no dump unless the user asks


def test_parity_cases_starts_silently():
    """A fresh process with libtpu installed (the cpu extra) and none of its variables set: stderr is empty
    (libtpu printed "E0000 ... INVALID_ARGUMENT" and a source-location trace before the defaults)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_") and k != "ALLOW_MULTIPLE_LIBTPU_LOAD"}
    code = ("import jax, jax.numpy as jnp; from harness.cli import main; "
            "rc = main(['cases', '--suite', 'smoke']); print(float(jnp.ones(3).sum()), jax.default_backend()); "
            "raise SystemExit(rc)")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("3.0 cpu")  # jax still computes, on the CPU
    assert done.stderr == "", done.stderr
