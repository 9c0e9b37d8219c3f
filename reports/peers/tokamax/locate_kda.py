"""Where tokamax 0.0.17's Pallas KDA (candidate ``tokamax-kda``) goes wrong on a case (README.md, KDA findings).

    python reports/peers/tokamax/locate_kda.py 'CASE_ID' [revisits] [exact] [highest=FILE:LINE,...] [seed=N] [chunks]
        [leg=NAME]

Runs the case through the candidate leg as ``parity run --backend tokamax-kda`` does (Pallas interpret mode, the MXU
model), then prints rel-L2 against the float64 reference for every tensor, per packed sequence (o and the per-token
gradients over each sequence's tokens, ht and dh0 per state) and per head (o). Each word changes one thing, for
locating only (never in a gated row):

- ``revisits``: jax's TPU interpreter raises "Revisited block" when a kernel's grid leaves an output block and
  comes back to it later. A TPU does not check: it writes the block's VMEM buffer back to HBM each time the block
  index changes, so the last visit's buffer wins, whatever it holds. With ``revisits`` the check records each
  revisit (printed) and the run goes on, as the chip would.
- ``exact``: no MXU model (every dot exact float32): what remains is not the MXU's passes.
- ``highest=FILE:LINE,...``: the ``jax.lax.dot_general`` and ``jnp.matmul`` calls at those lines of tokamax's
  source (``FILE:0``: all of that file's) run at ``Precision.HIGHEST`` (the MXU model then gives them its
  six-pass f32 product) where tokamax leaves the default: how much of the error those dots hold.
- ``seed=N``: draw N of the case (``Case.seed``), as ``--draws`` makes it.

Two words change only what is printed or which leg runs:

- ``chunks``: also rel-L2 of each per-token tensor over each 64-token chunk, and over each 16-row band of a chunk's
  rows (rows 0-15, 16-31, 32-47, 48-63 of every chunk pooled): where in the tensor the error sits.
- ``leg=NAME``: run another leg on the same inputs (``leg=gpu``: fla under the Triton interpreter, on the 3.11
  stack, where fla is installed), to compare the same cells.

Runs on tokamax's environment (Python >= 3.12, ``pip install tokamax==0.0.17``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from pathlib import Path

import numpy as np


def _rel(got, want) -> str:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.size == 0:
        return "(empty)"
    if not np.all(np.isfinite(got)):
        return f"non-finite ({int(np.sum(~np.isfinite(got)))} of {got.size})"
    scale = np.linalg.norm(want)
    return f"{np.linalg.norm(got - want) / scale:.3g}" if scale else f"(reference zero; |got| {np.abs(got).max():.3g})"


@contextlib.contextmanager
def revisits_allowed(seen: list):
    """jax's interpreter records an output block's revisit instead of raising (module doc)."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    original = ipc._check_for_revisiting
    check = original.__wrapped__  # the check itself, without the wrapper that fails the whole run

    @ipc.fail_on_exception
    def record(token, device_id, local_core_id, loop_idx, output_blocks):
        try:
            return check(token, device_id, local_core_id, loop_idx, output_blocks)
        except RuntimeError as exc:  # the chip writes the buffer back and goes on: record the visit, go on
            seen.append(str(exc).splitlines()[0][:200])
            import jax

            ranges = [ipc.interpret_utils.to_range(b) if b is not None else None
                      for b in jax.tree.map(int, output_blocks)]
            ipc._get_shared_memory().output_ranges[(int(device_id), int(local_core_id))].append(
                (tuple(int(x) for x in loop_idx), ranges))
            return token

    ipc._check_for_revisiting = record
    try:
        yield
    finally:
        ipc._check_for_revisiting = original


@contextlib.contextmanager
def highest_at(lines: set, hits: list):
    """``jax.lax.dot_general`` and ``jnp.matmul`` called from one of ``lines`` ({(file name, line)}, the line of
    the call's first token; line 0: every line of the file) with no precision, or the default, at
    Precision.HIGHEST; each call changed is appended to ``hits``."""
    import dis

    import jax
    import jax.numpy as jnp

    def wrap(original, position: int):
        def call(*args, **kwargs):
            caller = sys._getframe(1)
            start = dis.Positions(*next(p for i, p in enumerate(caller.f_code.co_positions())
                                        if 2 * i == caller.f_lasti)).lineno
            name = Path(caller.f_code.co_filename).name
            precision = kwargs.get("precision", args[position] if len(args) > position else None)
            if ((name, start) in lines or (name, 0) in lines) and precision in (None, jax.lax.Precision.DEFAULT):
                kwargs["precision"] = jax.lax.Precision.HIGHEST
                args = args[:position]
                hits.append((name, start))
            return original(*args, **kwargs)

        return call

    saved = jax.lax.dot_general, jnp.matmul
    jax.lax.dot_general, jnp.matmul = wrap(saved[0], 3), wrap(saved[1], 2)  # precision's position in each
    try:
        yield
    finally:
        jax.lax.dot_general, jnp.matmul = saved


def main(case_id: str, *words: str) -> None:
    from cases.inputs import make_inputs
    from harness.app import case_from_id
    from harness.legs import external
    from harness.legs.registry import make_leg
    from harness.ops import get_op
    from peers.mapping import requests

    case = case_from_id(case_id)
    lines = set()
    for word in words:
        if word.startswith("seed="):
            case = dataclasses.replace(case, seed=int(word[5:]))
        if word.startswith("highest="):
            for spec in word[8:].split(","):
                name, _, line = spec.rpartition(":")
                lines.add((name, int(line)))
    op = get_op(case.op)
    inputs = make_inputs(case, op.inputs(case))
    leg_name = next((w[4:] for w in words if w.startswith("leg=")), "tokamax-kda")
    leg = make_leg(leg_name)
    seen: list = []
    hits: list = []
    saved_mxu = external.mxu_rounding
    if "exact" in words:
        external.mxu_rounding = contextlib.nullcontext
    try:
        with (revisits_allowed(seen) if "revisits" in words else contextlib.nullcontext()), highest_at(lines, hits):
            got = leg.run(op, case, inputs).tensors
    except Exception as exc:  # noqa: BLE001 - a finding: print what the run raised
        print(f"{case.id}\n  the run raised {type(exc).__name__}: {str(exc).splitlines()[-1][:300]}")
        return
    finally:
        external.mxu_rounding = saved_mxu
    want = op.reference(case, inputs.as_float64(), method="chunk")
    label = ", ".join(w for w in words if not w.startswith(("seed=", "leg="))) or "as gated"
    print(f"{case.id}\n  {leg_name} ({label}):")
    if lines:
        print(f"    raised to HIGHEST: {len(hits)} traced call(s) at " + ", ".join(f"{f}:{n}" for f, n in sorted(set(hits)))
              + ("; NONE matched" if not hits else ""))
    for msg in dict.fromkeys(seen):
        print(f"    interpreter: {msg}")
    offsets, lengths = requests(case)
    got = {name: np.asarray(x) for name, x in got.items() if np.ndim(x)}  # a tensor the run did not make: none
    per_token = [name for name in got if name in ("o", "dq", "dk", "dv", "dg", "dbeta")]
    for name in [n for n in got if n not in per_token and n not in ("ht", "dh0")]:
        print(f"    {name}: {_rel(got[name], want[name])}")
    for i, (bos, eos) in enumerate(zip(offsets, offsets[1:])):
        row = 0 if case.lens is not None else i
        span = slice(bos, eos) if case.lens is not None else slice(None)
        cells = [f"{n} {_rel(np.asarray(got[n])[row, span], np.asarray(want[n])[row, span])}" for n in per_token
                 if eos > bos]
        cells += [f"{n} {_rel(np.asarray(got[n])[i], np.asarray(want[n])[i])}" for n in ("ht", "dh0") if n in got]
        print(f"    sequence {i} ({eos - bos} tokens): " + ", ".join(cells))
    if "chunks" in words:
        _print_chunks(case, got, want, per_token)
    heads = ", ".join(_rel(np.asarray(got["o"])[:, :, h], np.asarray(want["o"])[:, :, h]) for h in range(case.HV))
    print(f"    o per head: {heads}; whole: " + ", ".join(f"{n} {_rel(got[n], want[n])}" for n in got))


CHUNK = 64
BAND = 16


def _print_chunks(case, got: dict, want: dict, names: list) -> None:
    """rel-L2 of each per-token tensor per 64-token chunk of the [B, T, ...] layout, and per 16-row band of a
    chunk's rows pooled over every chunk (a packed case's chunks are of the packed row, as the kernels see them
    before their own alignment)."""
    T = case.T
    for name in names:
        g, w = np.asarray(got[name], np.float64), np.asarray(want[name], np.float64)
        chunks = [_rel(g[:, t:t + CHUNK], w[:, t:t + CHUNK]) for t in range(0, T, CHUNK)]
        rows = np.arange(T) % CHUNK
        bands = [_rel(g[:, (rows >= b) & (rows < b + BAND)], w[:, (rows >= b) & (rows < b + BAND)])
                 for b in range(0, min(CHUNK, T), BAND)]
        print(f"    {name} per chunk: {', '.join(chunks)}; per band of rows: {', '.join(bands)}")


if __name__ == "__main__":
    main(*sys.argv[1:])
