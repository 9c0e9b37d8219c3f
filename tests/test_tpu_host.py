"""A library that chooses interpret mode from the runtime compiles as it would on a TPU host (issue 48): while the
candidate leg compiles a case for a target, ``jax.default_backend()`` and ``jax.devices()`` answer as that
target's host would, on that thread only, and are restored after."""

import threading

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from harness.legs import external
from harness.legs.external import ExternalLeg, tpu_host
from harness.compile.tpu_compile import compile_for, libtpu_version

pytestmark = pytest.mark.skipif(libtpu_version() is None, reason="needs libtpu (the cpu or tpu extra)")


def _double(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2


def by_backend(x):
    # deltanet-tpu 0.3.0 and atomic-ops' atomic_gdn2 decide so, at trace time
    interpret = jax.default_backend() != "tpu"
    return pl.pallas_call(_double, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=interpret)(x)


def by_devices(x):
    # tops' is_tpu_runtime (uncached), and atomic-ops' is_tpu_available: the devices' platform
    interpret = not all(d.platform == "tpu" for d in jax.devices())
    return pl.pallas_call(_double, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=interpret)(x)


def test_the_runtime_answers_as_a_tpu_host_inside_the_block_only():
    public = {name: getattr(jax, name) for name in external.HOST_QUERIES}
    seen = []
    with tpu_host("v6e"):
        assert jax.default_backend() == "tpu"
        [device] = jax.devices()
        assert device.platform == "tpu" and "v6" in device.device_kind
        assert jax.local_devices() == [device] and jax.device_count() == 1 and jax.devices("tpu") == [device]
        assert jax.devices("cpu")[0].platform == "cpu"  # a query naming another platform: the real one
        worker = threading.Thread(target=lambda: seen.append(jax.default_backend()))
        worker.start()
        worker.join()
    assert seen == ["cpu"]  # another thread sees the real runtime
    assert {name: getattr(jax, name) for name in external.HOST_QUERIES} == public  # restored
    assert jax.default_backend() == "cpu"


@pytest.mark.parametrize("library", [by_backend, by_devices])
def test_a_library_choosing_interpret_mode_from_the_runtime_compiles_as_on_a_tpu(library):
    x = jnp.ones((8, 128), jnp.float32)
    jax.clear_caches()
    plain = compile_for(library, (x,), "v6e")  # without the host's answers: it asked for interpret mode
    assert plain.status == "error" and "asked by their library for interpret mode" in plain.error
    leg = ExternalLeg("host-test", "unused:OBJECT")
    hosted = leg.compile_for(compile_for, library, x, "v6e")
    assert hosted.ok, hosted.error
    assert hosted.kernel_counts == {"kernels_traced": 1, "kernels_mosaic": 1}
    assert jax.default_backend() == "cpu"
