"""deltanet-tpu 0.3.0's ``chunk_gdn`` as a candidate leg, written from docs/legs.md alone (issue 48's check).

Load it with ``--impl deltanet=binding:IMPLEMENTATION`` and this folder on ``PYTHONPATH``; the library installs with
``pip install --no-deps --ignore-requires-python deltanet-tpu==0.3.0`` (its metadata asks for Python 3.12 and jax
0.11; its modules import and run on 3.11 with jax 0.10.2). It picks interpret mode itself from
``jax.default_backend()``: the candidate leg's compile answers that as a TPU host would, so no patch is needed.
"""
import deltanet_tpu  # the library, imported at module level

from harness.ops.base import LegBinding


def supports(case):
    """Packed sequences: its ``initial_state`` applies to the first sequence only and an empty one raises; the
    in-kernel gate, beta's sigmoid and the convolution are not in ``chunk_gdn``."""
    if case.cu_seqlens is not None:
        return "this binding does not pass packed sequences"
    o = case.opt
    if o.get("use_gate_in_kernel") or o.get("use_beta_sigmoid_in_kernel") or o.get("conv1d"):
        return "chunk_gdn takes the activated gate and beta"
    return None


def forward(case, a, ctx):
    out = deltanet_tpu.chunk_gdn(a["q"], a["k"], a["v"], a["g"], a["beta"], initial_state=a.get("h0"),
                                 output_final_state=case.final_state,
                                 chunk_size=128,  # its Pallas kernels' only chunk size (fla's are at most 64)
                                 scale=case.resolved_scale,
                                 qk_l2norm=bool(case.opt.get("use_qk_l2norm_in_kernel")))
    o, ht = out if case.final_state else (out, None)
    return {"o": o, "ht": ht}


class Impl:
    bindings = {"gdn": LegBinding(forward, supports=supports, describe=lambda case: {"chunk_size": 128})}


IMPLEMENTATION = Impl()
