"""§2: a compile for v6e (no TPU attached) written to jax's persistent cache, then read back by a second process.

Run twice with the same directory: ``python cc.py DIR``. The compile here is jax's plain ``lowered.compile()``,
not the harness's ``compile_lowered`` (which never writes one): the first run writes the entry, the second warns
that libtpu's compile-only client cannot load it, and compiles again."""

import glob
import os
import sys

os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v6e-4")
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
import harness  # noqa: E402,F401  (libtpu's defaults without a TPU; the dump flag left out of jax's key)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import pallas as pl, topologies  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def double_plus_one(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0 + 1.0


def doubled(x):
    return pl.pallas_call(double_plus_one, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


device = topologies.get_topology_desc(topology_name="v6e:2x2", platform="tpu").devices[0]
sharding = NamedSharding(Mesh(np.array([device]), ("x",)), PartitionSpec())
jax.jit(doubled).trace(jax.ShapeDtypeStruct((8, 128), jnp.float32, sharding=sharding)).lower().compile()
print(sorted(os.path.basename(p) for p in glob.glob(os.path.join(sys.argv[1], "jit_doubled*"))))
