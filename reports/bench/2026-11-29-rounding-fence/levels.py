"""First and warm run of the TPU leg on three smoke cases, the leg's compile options given as JSON (argv[1]); the tensors
are pickled to argv[2] to compare levels: python levels.py '{"xla_backend_optimization_level": 1}' /tmp/l1.pkl [case ids instead of the three]"""
import os, sys, time, pickle, json
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v6e-4"); os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
import numpy as np
import harness.legs.tpu as t
t.INTERPRET_COMPILER_OPTIONS = tuple(json.loads(sys.argv[1]).items())
from cases.inputs import make_inputs
from harness.app.selection import case_from_id
from harness.legs.registry import leg_spec
from harness.ops import get_op
leg = leg_spec("tpu").build(force_interpret=True, compile_targets=())
ids = sys.argv[3:] or ["kda.chunk/B1-T128-H2-K128-V128/bf16/g=logsigmoid/16,lb-5/C64/h0,dht,use_beta_sigmoid_in_kernel=1,use_qk_l2norm_in_kernel=1",
       "gdn.chunk/B1-T64-H2-K128-V128/bf16/g=logsigmoid/16/C64/h0,use_gate_in_kernel=1",
       "simple_gla.chunk/B1-T128-H2-K128-V128/bf16/g=logsigmoid/16/C64/h0,dht"]
out = {}
tot = 0
for i in ids:
    c = case_from_id(i); op = get_op(c.op); inp = make_inputs(c, op.inputs(c))
    t0 = time.perf_counter(); o = leg.run(op, c, inp); t1 = time.perf_counter(); leg.run(op, c, inp); t2 = time.perf_counter()
    out[i] = {k: np.asarray(v) for k, v in o.tensors.items() if v is not None}
    print(f"{t1-t0:6.2f} first {t2-t1:5.2f} warm {i[:40]}", flush=True); tot += t1 - t0
print("total first", round(tot, 2))
pickle.dump(out, open(sys.argv[2], "wb"))
