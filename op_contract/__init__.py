"""The op contract: what a valid call of simple_gla, gla, kda, gdn and gdn2 is, checked once for every
implementation.

The float64 references (``references``) and the Pallas TPU kernels (``kernels_tpu``) are independent
implementations and never import each other; both validate their arguments with this package before
computing (the kernels before tracing), so the same bad input raises the same exception with the same
message. Invalid input is a ValueError that names the value and says the fix:

- q, k [B,T,H,K] and v [B,T,HV,V], one floating dtype (int and bool arrays are invalid), none empty;
  the gate, beta, initial_state, do and dht at their op's shapes, floating;
- grouped value heads (fla's GVA, kda and gdn only): HV a multiple of H, value head j reading q/k head
  j // (HV // H); v, do, the gate, beta, A_log, dt_bias and the state then have HV heads. Messages write
  the value-head axis HV (``[B,T,HV,V]``, ``[N,HV,K,V]``) when HV != H, and H otherwise;
- ``cu_seqlens`` (packed variable-length sequences, as fla): N+1 integer offsets, 0 first, strictly
  increasing, T last, with B == 1; initial_state and dht are then [N,HV,K,V], one state per sequence;
- ``chunk_size`` a positive int (bool is not); ``scale`` None (K**-0.5) or a finite non-zero number;
- gates are log decays: ``g`` and ``g_gamma`` must be <= 0 (0 is decay 1; the raw in-kernel gate input of
  kda and gdn, ``use_gate_in_kernel=True``, may have any sign). Values are checked when they are known
  (numpy arrays, concrete jax arrays); a gate traced inside jit/vjp is not checked;
- options: ``kda_options`` / ``gdn_options`` / ``gdn2_options`` fill in fla's defaults (``KDA_OPTIONS``,
  ``GDN_OPTIONS``, ``GDN2_OPTIONS``); an unknown option is a TypeError. gdn's ``allow_neg_eigval`` needs
  ``use_beta_sigmoid_in_kernel``.

What an implementation does not implement for valid input (the kernels' K, V lane multiples, dtypes,
chunk sizes; grouped value heads for simple_gla and gla) is its NotImplementedError, raised after these
checks. Only numpy and jax.numpy are used here (no Pallas).
"""

from .checks import (Dims, check_chunk_size, check_cu_seqlens, check_floating, check_log_decay, check_qkv,
                     concrete_max, described, expect, positive_int, resolve_scale, shape_of)
from .ops import (GDN2_OPTIONS, GDN_OPTIONS, KDA_OPTIONS, check_gate_choice, check_gdn, check_gdn2, check_gla,
                  check_kda, check_simple_gla, gdn2_options, gdn_options, kda_options)

__all__ = ["Dims", "GDN2_OPTIONS", "GDN_OPTIONS", "KDA_OPTIONS", "check_chunk_size", "check_cu_seqlens",
           "check_floating", "check_gate_choice", "check_gdn", "check_gdn2", "check_gla", "check_kda",
           "check_log_decay", "check_qkv", "check_simple_gla", "concrete_max", "described", "expect", "gdn2_options",
           "gdn_options", "kda_options", "positive_int", "resolve_scale", "shape_of"]
