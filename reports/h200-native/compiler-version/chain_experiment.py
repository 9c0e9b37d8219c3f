"""Experiment: the native rows' compiler (triton 3.7.1) sums a thread's registers as a sequential chain of fused
multiply-adds, where triton 3.9 (the installed one, whose order the emulation reads) sums them as a tree. Replace,
from this script only, the within-thread levels of the emulation's ordered sum by 3.7.1's chain, and compare both
with the H200's rows on the given cases.

    PARITY_CACHE_DIR=DIR python reports/h200-native/compiler-version/chain_experiment.py CASE_ID ...

The chain, as 3.7.1's PTX writes it (toy_sum.py beside this script): acc = fma(a0, b0, round(a1 b1)), then
acc = fma(a_i, b_i, acc) for i = 2, 3, ... in register order (plain adds when the summand is no product); the
lanes' and warps' levels stay as the layout gives them."""

import sys

import numpy as np
import pandas as pd

from harness.emulation import reduce_order as ro

tree = ro.ordered_sum


def chain(x, axis, levels, product=None, fma=None, add=ro.add_f32):
    thread = [b for where, b in levels if where == "thread"]
    rest = [lv for lv in levels if lv[0] != "thread"]
    if len(thread) < 2:
        return tree(x, axis, levels, product=product, fma=fma, add=add)
    x = np.moveaxis(np.asarray(x), axis, -1)
    prods = None if product is None else [np.moveaxis(np.asarray(p), axis, -1) for p in product]
    n = x.shape[-1]
    # register index i holds the axis coordinates whose thread bits are i's bits in register order
    regs = [sum(((i >> k) & 1) << b for k, b in enumerate(thread)) for i in range(1 << len(thread))]
    others = [c for c in range(n) if all(((c >> b) & 1) == 0 for b in thread)]  # the thread's first element
    acc = None
    for i, r in enumerate(regs):
        cols = [o | r for o in others]
        xi = x[..., cols]
        if i == 0:
            first = xi
            continue
        if i == 1:
            acc = fma(prods[0][..., [o | regs[0] for o in others]], prods[1][..., [o | regs[0] for o in others]],
                      xi) if prods is not None else add(first, xi)
            continue
        acc = fma(prods[0][..., cols], prods[1][..., cols], acc) if prods is not None else add(acc, xi)
    # acc holds one partial per 'others' coordinate: the remaining (lane, warp) bits, in their own order
    m = n.bit_length() - 1
    keep = [b for b in range(m) if b not in thread]
    full = np.zeros(x.shape[:-1] + (1 << len(keep), ), dtype=acc.dtype)
    for j, o in enumerate(others):
        idx = sum(((o >> b) & 1) << k for k, b in enumerate(keep))
        full[..., idx] = acc[..., j]
    relabel = {b: k for k, b in enumerate(keep)}
    return tree(full, full.ndim - 1, [(w, relabel[b]) for w, b in rest], add=add)


def run(cases, variant):
    from harness.app import case_from_id
    from harness.legs import make_leg
    from harness.run.reference_cache import ReferenceCache
    from harness.run.runner import Runner

    ro.ordered_sum = chain if variant == "3.7.1 chain" else tree
    try:
        rows = [r for c in cases for r in Runner(make_leg("gpu"), ReferenceCache(None)).run_case(case_from_id(c))]
    finally:
        ro.ordered_sum = tree
    return pd.DataFrame(rows)[["case_id", "tensor", "status", "rel_l2"]].assign(variant=variant)


if __name__ == "__main__":
    from harness.emulation.setup import enable_interpreter_mode

    enable_interpreter_mode()
    cases = sys.argv[1:]
    native = pd.read_csv("reports/h200-native/gpu-smoke-regressions.csv.gz")[["case_id", "tensor", "rel_l2"]]
    got = pd.concat([run(cases, "3.9 tree"), run(cases, "3.7.1 chain")])
    t = got.merge(native, on=["case_id", "tensor"], suffixes=("", "_native"))
    t["ratio"] = t.rel_l2 / t.rel_l2_native
    t["abs_ln"] = np.abs(np.log(t.ratio))
    pd.set_option("display.width", 250)
    print(t.pivot_table(index=["case_id", "tensor"], columns="variant", values="ratio").round(3).to_string())
    print(t.groupby("variant").abs_ln.mean().round(4).to_string())
