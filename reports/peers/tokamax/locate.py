"""Where tokamax's serving kernel goes wrong on a case (reports/peers/tokamax/README.md, findings 1 and 2).

    python reports/peers/tokamax/locate.py records 'CASE_ID'        # finding 1: the batched metadata read past its end
    python reports/peers/tokamax/locate.py padded 'CASE_ID' [exact] # the same case with the request arrays padded

``records``: what the batched (decode) segment's grid reads of its per-request metadata against what it holds
(``metadata.compute_batched_seq_metadata`` builds arrays of ``num_seqs`` entries; each tile of ``decode_tile_size``
requests reads ``decode_tile_size`` entries; ``memory_ref.MetadataRef.create`` pads nothing), then the binding's run
(the candidate leg, Pallas interpret mode), whose error names the out-of-bounds read.

``padded``: a throw-away change to the call, not the binding: the request arrays get null requests (no tokens,
slot 0, seq_len 0) up to a multiple of ``decode_tile_size``, as tpu-inference v3 pads its records. Prints rel-L2
against the float64 reference per request (o, ht, conv_ht) and per value head (o), as
reports/peers/serving/locate.py does; ``exact`` leaves every dot exact (no MXU model): what remains of the error
is not the MXU's passes. Runs on tokamax's environment (Python 3.12, tokamax @ 783ea95).
"""

from __future__ import annotations

import contextlib
import sys

import numpy as np

DECODE_TILE = 4
"""The op's ``decode_tile_size`` default (``pallas_mosaic_tpu.py``)."""


def _rel(got, want) -> str:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if np.array_equal(got, want):
        return "0 (bit for bit)"
    scale = np.linalg.norm(want)
    return f"{np.linalg.norm(got - want) / scale:.3g}" if scale else "(reference all zeros)"


def padded(op):
    """``op`` with its request arrays padded by null requests to a multiple of :data:`DECODE_TILE`."""
    import jax.numpy as jnp

    def call(**kw):
        n = kw["state_indices"].shape[0]
        pad = -n % DECODE_TILE
        starts = kw["query_start_loc"]
        kw["query_start_loc"] = jnp.concatenate([starts, jnp.repeat(starts[-1:], pad)])
        kw["state_indices"] = jnp.pad(kw["state_indices"], (0, pad))
        kw["seq_lens"] = jnp.pad(kw["seq_lens"], (0, pad))
        return op(**kw)

    return call


def main(mode: str, case_id: str, exact: str = "") -> None:
    import peers.tokamax as tk
    from cases.inputs import make_inputs
    from harness.app import case_from_id
    from harness.legs import external
    from harness.legs.registry import make_leg
    from harness.ops import get_op
    from peers.mapping import requests

    case = case_from_id(case_id)
    s = tk.slot_arguments(case)
    n, end = len(s["state_indices"]), s["distribution"][0]
    tiles = -(-end // DECODE_TILE)
    print(f"{case_id}\n  requests {n}, batched (decode) segment: the first {end}, {tiles} tile(s) of {DECODE_TILE}: "
          f"its grid reads metadata entries 0..{tiles * DECODE_TILE - 1} of arrays holding {n}"
          + (f": {tiles * DECODE_TILE - n} past the end" if tiles * DECODE_TILE > n else ": none past the end"))
    op = get_op(case.op)
    inputs = make_inputs(case, op.inputs(case))
    leg = make_leg("tokamax")
    saved_op, saved_mxu = tk.OP, external.mxu_rounding
    if mode == "padded":
        tk.OP = padded(saved_op)
    if exact:
        external.mxu_rounding = contextlib.nullcontext
    try:
        got = leg.run(op, case, inputs).tensors
    except Exception as exc:  # noqa: BLE001 - the finding: print what the run raised
        print(f"  the run raised {type(exc).__name__}: {str(exc).splitlines()[-1][:300]}")
        return
    finally:
        tk.OP, external.mxu_rounding = saved_op, saved_mxu
    want = op.reference(case, inputs.as_float64(), method="chunk")
    offsets, _ = requests(case)
    print(f"  tokamax{' (request arrays padded)' if mode == 'padded' else ''}{' (every dot exact)' if exact else ''}:")
    for i, (bos, eos) in enumerate(zip(offsets, offsets[1:])):
        o = _rel(got["o"][:, bos:eos], want["o"][:, bos:eos]) if eos > bos else "(no tokens)"
        print(f"    request {i} ({eos - bos} tokens{', batched' if i < end else ''}): o {o}, "
              f"ht {_rel(got['ht'][i], want['ht'][i])}, conv_ht {_rel(got['conv_ht'][i], want['conv_ht'][i])}")
    heads = ", ".join(_rel(got["o"][:, :, h], want["o"][:, :, h]) for h in range(case.HV))
    print(f"    o per value head: {heads}; whole o {_rel(got['o'], want['o'])}, ht {_rel(got['ht'], want['ht'])}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
