import os, sys, time
sys.path.insert(0, "/work/main")
import numpy as np
from references.gdn import chunk_gdn, chunk_gdn_bwd
from references.kda import chunk_kda, chunk_kda_bwd
which, T, H = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(0)
B, K, V = 1, 128, 128
q = rng.standard_normal((B, T, H, K)) / np.sqrt(K); k = rng.standard_normal((B, T, H, K)); k /= np.linalg.norm(k, axis=-1, keepdims=True)
v = rng.standard_normal((B, T, H, V)); beta = rng.uniform(0, 1, (B, T, H))
do = rng.standard_normal((B, T, H, V)); h0 = rng.standard_normal((B, H, K, V)); dht = rng.standard_normal((B, H, K, V))
if which == "gdn":
    g = -rng.uniform(0.001, 0.1, (B, T, H)); fwd, bwd = chunk_gdn, chunk_gdn_bwd
else:
    g = -rng.uniform(0.001, 0.1, (B, T, H, K)); fwd, bwd = chunk_kda, chunk_kda_bwd
out = {}
for method in ("chunk", "recurrent"):
    ts = []
    for rep in range(3):
        t = time.perf_counter(); o, ht = fwd(q, k, v, g, beta, initial_state=h0, output_final_state=True, method=method)
        d = bwd(q, k, v, g, beta, do, dht, initial_state=h0, method=method); ts.append(time.perf_counter() - t)
    print(f"{which} T{T} H{H} {method}: first {ts[0]:.2f}s warm {min(ts[1:]):.3f}s")
    out.update({f"{method}_{k_}": v_ for k_, v_ in dict(o=o, ht=ht, **d).items() if v_ is not None})
np.savez(f"/tmp/s6/ref_{which}_{T}_{os.environ.get('TAG','base')}.npz", **out)
