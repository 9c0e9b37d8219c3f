"""jax's persistent compilation cache for the CPU's programs (harness.compile.xla_cache): where it goes, what keys
it, and that a compile for a TPU target never goes through it."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import harness.compile.xla_cache
from harness.compile.xla_cache import SUBDIRECTORY, cache_directory, cache_environment, host_key, loads_silently

X86 = ("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\n"
       "flags\t\t: fpu sse2 avx2 fma\n\nprocessor\t: 1\nmodel name\t: another\nflags\t\t: fpu\n")


def test_the_host_key_is_the_digest_of_the_architecture_and_the_first_processors_fields():
    text = ("x86_64\nmodel name=Intel(R) Xeon(R) CPU @ 2.20GHz\nflags=fpu sse2 avx2 fma\n"
            "CPU implementer=\nCPU part=\nFeatures=")
    assert host_key(X86, "x86_64") == hashlib.sha256(text.encode()).hexdigest()[:16]


def test_a_cpu_without_fma_or_another_model_or_architecture_gets_another_directory():
    keys = {host_key(X86, "x86_64"), host_key(X86.replace(" fma", "", 1), "x86_64"),
            host_key(X86.replace("2.20GHz", "2.30GHz", 1), "x86_64"), host_key(X86, "aarch64")}
    assert len(keys) == 4
    arm = "processor\t: 0\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n"
    assert host_key(arm, "aarch64") != host_key(arm.replace("0xd0c", "0xd40"), "aarch64")
    # no field known (macOS: the processor's name only): the text decides
    assert host_key("arm", "arm64") != host_key("i386", "arm64")


def test_a_jaxlib_before_0_10_loads_noisily():
    assert [loads_silently(v) for v in ("0.9.2", "0.4.38", "0.10.0", "0.10.2", "0.12.0.1", "1.0")] == [
        False, False, True, True, True, True]


@pytest.fixture
def silent_loader(monkeypatch):
    """The rules below on any stack: the installed jaxlib's loader taken as a silent one."""
    monkeypatch.setattr(harness.compile.xla_cache, "loads_silently", lambda: True)


def test_the_directory_is_under_the_caches_root_unless_there_is_none_a_tpu_or_the_users_own(tmp_path,
                                                                                             silent_loader):
    no_tpu = (str(tmp_path / "accel[0-9]*"),)
    root = {"PARITY_CACHE_DIR": str(tmp_path / "cache")}
    assert cache_directory(root, no_tpu) == tmp_path / "cache" / SUBDIRECTORY / host_key()
    assert cache_directory({"PARITY_CACHE_DIR": ""}, no_tpu) is None
    assert cache_directory({**root, "JAX_COMPILATION_CACHE_DIR": "/theirs"}, no_tpu) is None
    (tmp_path / "accel0").touch()
    assert cache_directory(root, no_tpu) is None


def test_a_noisy_loader_gets_no_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(harness.compile.xla_cache, "loads_silently", lambda: False)
    assert cache_directory({"PARITY_CACHE_DIR": str(tmp_path)}, (str(tmp_path / "accel[0-9]*"),)) is None


def test_the_variables_set_for_the_processes_started_keep_every_program_unless_the_user_said_otherwise(tmp_path,
                                                                                                    silent_loader):
    no_tpu = (str(tmp_path / "accel[0-9]*"),)
    root = {"PARITY_CACHE_DIR": str(tmp_path / "cache")}
    path = str(tmp_path / "cache" / SUBDIRECTORY / host_key())
    assert cache_environment(root, no_tpu) == {"JAX_COMPILATION_CACHE_DIR": path,
                                               "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.0",
                                               "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    theirs = {**root, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "1.5"}
    assert cache_environment(theirs, no_tpu)["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "1.5"
    assert cache_environment({"PARITY_CACHE_DIR": ""}, no_tpu) == {}


PROGRAM = r"""
import json, os, sys
import harness  # noqa: F401  (the cache turned on at import)
import jax, jax.numpy as jnp
from jax._src import monitoring
seen = []
monitoring.register_event_listener(lambda event, **kw: seen.append(event))
jax.config.update("jax_enable_x64", True)
x = jnp.linspace(0.1, 3.0, 4096, dtype=jnp.float64)
y = jax.jit(lambda x: jnp.cumsum(jnp.sin(x) * jnp.exp(-x)) @ jnp.cos(x))(x)
print(json.dumps({"y": float(y).hex(), "hits": seen.count("/jax/compilation_cache/cache_hits"),
                  "dir": jax.config.jax_compilation_cache_dir, "dump": os.environ.get("LIBTPU_INIT_ARGS", "")}))
"""


def _run(code, env):
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done


def _env(tmp_path, **extra):
    """This process's environment, less what its own import of the harness set: a front's."""
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", "LIBTPU_INIT_ARGS")}
    return {**env, "PARITY_CACHE_DIR": str(tmp_path / "cache"), **extra}


def test_a_second_process_is_served_the_first_ones_program_with_the_same_bits(tmp_path):
    """Each process dumps Mosaic's passes into a directory of its own (LIBTPU_INIT_ARGS differs), which jax's key
    would otherwise hash: the second still finds the first's entries. The second is started as a front's child
    whose rows go elsewhere (PARITY_CACHE_DIR of its own): it inherits the front's cache of programs."""
    first = json.loads(_run(PROGRAM, _env(tmp_path)).stdout)
    if not loads_silently():  # this stack's jaxlib: no cache at all
        assert first["dir"] is None and not (tmp_path / "cache" / SUBDIRECTORY).exists()
        pytest.skip("this jaxlib loads an entry noisily: the harness keeps no cache (SILENT_LOADER)")
    child = _env(tmp_path, PARITY_CACHE_DIR=str(tmp_path / "rows"), JAX_COMPILATION_CACHE_DIR=first["dir"])
    served = _run(PROGRAM, child)
    assert served.stderr == "", served.stderr  # loaded without a word (SILENT_LOADER)
    second = json.loads(served.stdout)
    assert first["dir"] == second["dir"] == str(tmp_path / "cache" / SUBDIRECTORY / host_key())
    assert first["hits"] == 0 and second["hits"] >= 1, (first, second)
    assert first["y"] == second["y"]
    if first["dump"]:  # libtpu installed: the processes' own dump directories, which the key leaves out
        assert first["dump"] != second["dump"]


def test_the_users_own_directory_is_kept(tmp_path):
    theirs = str(tmp_path / "theirs")
    out = json.loads(_run(PROGRAM, _env(tmp_path, JAX_COMPILATION_CACHE_DIR=theirs)).stdout)
    assert out["dir"] == theirs and not (tmp_path / "cache" / SUBDIRECTORY).exists()


TPU_COMPILE = r"""
import json
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from harness.compile.tpu_compile import compile_for

def double_plus_one(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0 + 1.0

def doubled(x):
    return pl.pallas_call(double_plus_one, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

result = compile_for(doubled, (jax.ShapeDtypeStruct((8, 128), jnp.float32),), "v6e")
print(json.dumps({"status": str(result.status), "error": result.error}))
"""


def test_a_compile_for_a_tpu_is_never_written_so_each_process_runs_the_compiler(tmp_path):
    pytest.importorskip("libtpu")
    env = _env(tmp_path)
    for _ in range(2):
        done = _run(TPU_COMPILE, env)
        assert json.loads(done.stdout)["status"] == "ok", done.stdout
        assert "persistent compilation cache" not in done.stderr, done.stderr
    written = [p.name for p in (tmp_path / "cache" / SUBDIRECTORY / host_key()).glob("*")]
    assert not [name for name in written if name.startswith("jit_doubled")], written
