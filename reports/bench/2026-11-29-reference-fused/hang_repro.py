"""The hang of the fused reference (README.md): run after ``git apply fused-forward.diff`` on e5fbd69's tree.

    python hang_repro.py 8+8 chunk 1      # return_outputs: hangs (faulthandler exits 1 after 40 s), 3 runs in 5
    python hang_repro.py 8+8 chunk 0      # the same program: it also returns o and ht now, so it hangs too
    python hang_repro.py 16 chunk 1       # one sequence, not packed: finishes
    python hang_repro.py 8+8 recurrent 1  # the token-by-token check, packed: finishes
"""

import faulthandler
import sys

import numpy as np

faulthandler.dump_traceback_later(40, exit=True)  # a hung XLA:CPU program never returns; this shows where it waits

from references import kda  # noqa: E402

lens, method, return_outputs = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
rng = np.random.default_rng(0)
T, H, K, V = 16, 1, 128, 128
r = lambda *s: rng.standard_normal(s)  # noqa: E731
q, k, v = r(1, T, H, K), r(1, T, H, K), r(1, T, H, V)
g, beta = -np.logaddexp(0, -r(1, T, H, K)) / 16, 1 / (1 + np.exp(-r(1, T, H)))
cu = np.cumsum([0] + [int(x) for x in lens.split("+")]).tolist()
N = len(cu) - 1
do, dht, h0 = r(1, T, H, V), r(N, H, K, V), r(N, H, K, V)
for i in range(20):
    kda.chunk_kda_bwd(q, k, v, g, beta, do, dht, initial_state=h0, cu_seqlens=cu if N > 1 else None, method=method,
                      return_outputs=return_outputs)
print("ok: 20 calls finished", flush=True)
