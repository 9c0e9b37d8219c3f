"""emulated GPU leg seconds per case set: reduce order on (True: sm_90, layouts cached) vs off (numpy's order)"""
import time, sys, functools
from harness.emulation.setup import enable_interpreter_mode
enable_interpreter_mode()
import harness.emulation as he
from harness.app import case_from_id
from harness.legs import make_leg
from harness.run.reference_cache import ReferenceCache
from harness.run.runner import Runner
cases = sys.argv[1:]
refs = ReferenceCache(None)
orig = he.triton_emulation
for target in (True, False, True, False, True, False):
    he.triton_emulation = functools.partial(orig, reduce_order=target)
    t0 = time.process_time()
    for c in cases:
        Runner(make_leg("gpu"), refs).run_case(case_from_id(c))
    print(target, round(time.process_time() - t0, 2), flush=True)
