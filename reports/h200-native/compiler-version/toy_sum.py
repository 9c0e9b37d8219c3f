"""The PTX a Triton version writes for one tl.sum of products (bf16; toy_sum.py --fp32 for float32), for sm_90, no
GPU needed: run it under triton 3.9.0 (the README's stack) and under triton 3.7.1 (the H200 rows' compiler,
`uv pip install triton==3.7.1 numpy` into a venv of its own) and compare the adds within a thread."""
import sys, triton, triton.language as tl
from triton.backends.compiler import GPUTarget
@triton.jit
def k(A, B, O, N: tl.constexpr, M: tl.constexpr):
    r = tl.arange(0, N)[:, None] * M + tl.arange(0, M)[None, :]
    a = tl.load(A + r); b = tl.load(B + r)
    s = tl.sum(a * b, axis=0)
    tl.store(O + tl.arange(0, M), s.to(tl.float32))
t = "*fp32" if "--fp32" in sys.argv else "*bf16"
sig = {"A": t, "B": t, "O": "*fp32", "N": "constexpr", "M": "constexpr"}
src = triton.compiler.ASTSource(fn=k, signature=sig, constexprs={"N": 64, "M": 64})
c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
ptx = c.asm["ptx"]
import re
body = [l for l in ptx.splitlines() if re.search(r"(add|fma|mul)\S*\.(bf16|f16|f32)|shfl", l)]
print(triton.__version__); print("\n".join(body[:40]))
