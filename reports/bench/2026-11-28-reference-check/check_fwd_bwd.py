"""The recurrent check forward and backward, gdn at B1-T2048-H4 K=V=128 C=64, random inputs, through the public
reference functions (``references.gdn.chunk_gdn`` / ``chunk_gdn_bwd`` with ``method="recurrent"``: the core plus the
driver's contract check, casts and numpy round trips); prints each call's wall time (the second is the one to read).
Run from a checkout:
    PYTHONPATH=. python reports/bench/2026-11-28-reference-check/check_fwd_bwd.py [T]

The README's "whole core" times were taken with an earlier version of this script that called the core directly
(``references.kda``'s private ``_core``, at commit 5773134); this one reaches it through public names only."""
import sys
import time

import numpy as np

from references.gdn import chunk_gdn, chunk_gdn_bwd

B, T, H, K, V = 1, int(sys.argv[1]) if len(sys.argv) > 1 else 2048, 4, 128, 128
rng = np.random.default_rng(0)
q = rng.standard_normal((B, T, H, K)) / np.sqrt(K)
k = rng.standard_normal((B, T, H, K)) / np.sqrt(K)
v = rng.standard_normal((B, T, H, V))
g = -np.abs(rng.standard_normal((B, T, H))) / 16
beta = rng.uniform(size=(B, T, H))
h0 = rng.standard_normal((B, H, K, V))
do = rng.standard_normal((B, T, H, V))
dht = rng.standard_normal((B, H, K, V))
calls = (("fwd", lambda: chunk_gdn(q, k, v, g, beta, initial_state=h0, output_final_state=True, method="recurrent")),
         ("bwd", lambda: chunk_gdn_bwd(q, k, v, g, beta, do, dht, initial_state=h0, method="recurrent")))
for name, fn in calls:
    for i in range(2):
        t0 = time.perf_counter()
        fn()
        print(name, i, time.perf_counter() - t0, flush=True)
