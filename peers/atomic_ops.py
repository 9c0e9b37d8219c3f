"""atomic-ops 0.2.0 (PyPI, MIT, gdn2-pallas's author) as candidates: ``atomic_gdn2``, its rewrite of the GDN-2
Pallas kernels ("research-grade", its README), on op ``gdn2``, forward and backward (its ``custom_vjp``).

**Its own environment.** The atomic-ops wheel installs two top-level packages, ``atomic_gdn2`` and
``atomic_ops`` (the previous generation, gdn2-pallas's code again, less its ``use_centering`` check), and
gdn2-pallas 0.1.1 installs ``atomic_ops`` too: in one environment the last install overwrites the other's files,
and each binding would run the other's code. This binding therefore runs where atomic-ops is the one installed,
and :func:`peers.mapping.provider` refuses every case anywhere else (gdn2-pallas's binding does the same the
other way round). An environment of its own, with the versions this project's CI pins (about 15 s with uv's
cache warm; no torch: the fla rows come from the main environment, ``--baseline-rows``)::

    uv venv -p python3.11 /tmp/venv-atomic
    uv pip install -p /tmp/venv-atomic/bin/python -c .ci/constraints.txt -e '.[tpu]' pytest pytest-xdist
    uv pip install -p /tmp/venv-atomic/bin/python --no-deps atomic-ops==0.2.0

(``python -m venv --system-site-packages`` over the main environment would not do: it sees gdn2-pallas's
``atomic_ops``.) ``reports/peers/gdn2/README.md`` gives the commands that gate it from there.

**The call.** Its quick start: ``fn = atomic_gdn2.make_blr_trainable(make_cfg(), scale); o, h_final = fn(q, k,
v, w, b, g, h0)`` on head-major tensors ``(B, H, L, D)``, ``L`` a multiple of ``bt``. The binding transposes the
harness's ``[B, T, H, D]`` tensors to head-major and ``o`` back (exact); q, k, v, b, w go in the case dtype, g and
h0 in float32, ``scale=case.resolved_scale``; fla's names mean what its arguments mean (``b`` erases through
``b * k``, ``w`` writes ``w * v``, ``g`` the per-channel log decay). ``h0`` absent: zeros, as fla. ``o`` comes back
float32 whatever the input dtype and is cast to the case dtype (round to nearest), as the other bindings do; the
rows' details record it. Its kernels (4): scores (A), the WY solve (B), the fused recompute and inter-chunk scan
(C+D), and one backward kernel (B1-B5).

Two candidates, one per documented ``diag`` of its config (``BLRConfig``: "'btl' (MXU) | 'lean' (exact
non-centered, slower)"), which change the numbers:

- ``atomic-ops``: ``make_cfg()``, its PROD preset (bt 128, score block 128, inner block bs2 32, leaf mb 8,
  ``diag="btl"``: the diagonal blocks' decays split into two exponentials about the block's middle, exact while
  half the block's decay span is below 88, its "T-22 boundary"; wy_eps 1e-3, the damped solve; dots "highest"
  for the scores and the scan, three bf16 products ("bf16x3") for the solve and the backward's B1-B3);
- ``atomic-ops-lean``: ``make_cfg(diag="lean")``, the diagonal blocks as clipped decay differences.

**Interpret mode.** Its config picks it when constructed (``interpret = jax.default_backend() != "tpu"``); the
binding constructs it at each call, so the candidate leg's compile, whose runtime answers as a TPU host's, gets
kernels built for Mosaic, and the emulated run's interpret mode is the leg's forced one either way.

Refused, with the reason: what its own checks reject, in its words (a ``ValueError`` from a ``raise`` line of
``atomic_gdn2``: "L=... must be divisible by bt=128"); K != V (its call documents "q..g: (B,H,L,D)": one head dim
for all six); the decode variant (no decode kernel); packed sequences (no ``cu_seqlens``); fla's in-kernel options
(``use_qk_l2norm_in_kernel``; ``use_gate_in_kernel`` with ``A_log``/``dt_bias``/``lower_bound``: its layer
applies its own gate, ``-min(softplus(g + bias), g_max)``, outside the kernel call; ``safe_gate``) and the
convolution in front; atomic-ops not installed or shadowed (above).
"""

from __future__ import annotations

from harness.ops.base import LegBinding

from . import mapping

DISTRIBUTION = "atomic-ops"
VERSION = "0.2.0"
INSTALL = f"pip install --no-deps {DISTRIBUTION}=={VERSION}, in an environment without gdn2-pallas"
ENTRY = "atomic_gdn2.make_blr_trainable"


# both of the wheel's packages must be its own: atomic_ops shadowed by gdn2-pallas's means the two were installed
# together
_LIB, IMPORT_ERROR = mapping.import_provided("atomic_gdn2", DISTRIBUTION, INSTALL, ("atomic_gdn2", "atomic_ops"))

REFUSED_OPTIONS = {
    "use_qk_l2norm_in_kernel": "its kernels take q and k as given (its layer normalises them outside)",
    "use_gate_in_kernel": "g is the log decay itself: it has no A_log/dt_bias gate",
    "safe_gate": "it has no safe_gate",
    "conv1d": "it has no convolution in front (conv1d)",
}


def supports(case) -> str | None:
    """None to run the case, else why atomic_gdn2 cannot take it (before anything is traced)."""
    if IMPORT_ERROR:
        return IMPORT_ERROR
    if case.variant != "chunk":
        return f"atomic_gdn2 has no {case.variant} kernel: its one path is chunked ({ENTRY})"
    why = mapping.refused_options(case, ENTRY, REFUSED_OPTIONS)
    if why:
        return why
    if case.cu_seqlens is not None:
        return f"{ENTRY} takes no packed sequences: its tensors are (B, H, L, D), with one h0 per batch row"
    if case.K != case.V:
        return f"{ENTRY}'s call takes 'q..g: (B,H,L,D)', one head dim for all six: K={case.K} != V={case.V}"
    return None


def _call(fn, *args):
    """``fn(*args)``; its own input checks (a ValueError raised by a ``raise`` line of ``atomic_gdn2``) become
    refusals in its words; anything else propagates (an ``error`` row)."""
    try:
        return fn(*args)
    except ValueError as exc:
        if not mapping.raised_by(exc, _LIB.__file__):
            raise
        raise NotImplementedError(f"atomic-ops refuses the case: {exc}") from None


def _forward(options: dict):
    def forward(case, a, ctx):
        import jax.numpy as jnp

        del ctx  # the config picks interpret mode when constructed (module doc); the leg forces it in the run
        fn = _LIB.make_blr_trainable(_LIB.make_cfg(**options), case.resolved_scale)
        head_major = [jnp.swapaxes(a[n], 1, 2) for n in ("q", "k", "v", "w", "b", "g")]
        o, ht = _call(fn, *head_major, a.get("h0"))
        return {"o": jnp.swapaxes(o, 1, 2).astype(a["q"].dtype), "ht": ht if case.final_state else None}

    return forward


def _describe(options: dict):
    def describe(case) -> dict:
        out = {"entry": f"{ENTRY}(make_cfg({', '.join(f'{k}={v!r}' for k, v in options.items())}), scale)",
               "layout": "head-major (B, H, L, D): q..g and o transposed (exact)",
               "ran_as": "Pallas: scores (A), WY solve (B), recompute + inter-chunk scan (C+D); backward: one "
                         "kernel (B1-B5)",
               "o_dtype": f"float32 returned, cast to {case.dtype}"}
        if _LIB is not None:
            cfg = _LIB.make_cfg(**options)
            out["config"] = {name: getattr(cfg, name) for name in ("bt", "score_bs", "bs2", "mb", "diag", "clip",
                                                                    "wy_eps", "dot_mode", "solve_dot_mode",
                                                                    "b3_dot_mode")}
        return out

    return describe


class AtomicGdn2:
    """The implementation object (:mod:`harness.legs.external`), at one config."""

    distribution = DISTRIBUTION  # the rows' version: atomic-ops', not this project's (which ships the binding)

    def __init__(self, **options):
        self.options = options
        self.bindings = {"gdn2": LegBinding(_forward(options), supports, describe=_describe(options))}


IMPLEMENTATION = AtomicGdn2()
LEAN = AtomicGdn2(diag="lean")
