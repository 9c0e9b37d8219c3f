"""Kernel ``for`` loops bind scalar tensors, as compiled Triton does (the interpreter binds ints)."""

from __future__ import annotations

import ast
from typing import Callable, Dict

import numpy as np

from .patcher import Patcher


def tensor_range(range_fn, *args, **kwargs):
    """Iterate a kernel ``range``/``tl.range`` loop yielding scalar tensors.

    Compiled Triton's induction variable is an int32 scalar (int64 when a bound
    is int64 or does not fit int32); the interpreter's is a Python int, so
    ``i.to(tl.int64)`` fails.  We yield interpreter tensors of the same type.
    """
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    r = range_fn(*args, **kwargs)
    if not isinstance(r, range):
        yield from r
        return
    wide = any(isinstance(a, tl.tensor) and a.dtype in (tl.int64, tl.uint64) for a in args)
    wide = wide or not all(-2**31 <= v < 2**31 for v in (r.start, r.stop, r.step))
    ty, npty = (tl.int64, np.int64) if wide else (tl.int32, np.int32)
    for i in r:
        yield tl.tensor(TensorHandle(np.array([i], dtype=npty), ty), ty)


class _InductionVarTransformer(ast.NodeTransformer):
    """``for x in range(...)`` / ``for x in tl.range(...)`` ->
    ``for x in __import__(<this module>).tensor_range(range, ...)``.

    ``static_range`` is left alone (its variable is a constexpr when compiled).
    ``__import__`` keeps the kernel module's globals untouched.
    """

    def visit_For(self, node):
        self.generic_visit(node)
        it = node.iter
        if isinstance(it, ast.Call):
            f = it.func
            is_range = (isinstance(f, ast.Name) and f.id == "range") or (isinstance(f, ast.Attribute)
                                                                            and f.attr == "range")
            if is_range:
                mod = ast.Call(func=ast.Name(id="__import__", ctx=ast.Load()), args=[ast.Constant(value=__name__)],
                               keywords=[
                                   ast.keyword(arg="fromlist",
                                               value=ast.List(elts=[ast.Constant(value="tensor_range")],
                                                              ctx=ast.Load()))
                               ])
                helper = ast.Attribute(value=mod, attr="tensor_range", ctx=ast.Load())
                node.iter = ast.copy_location(ast.Call(func=helper, args=[f, *it.args], keywords=it.keywords), it)
        return node


_EMU_REWRITTEN: Dict[Callable, Callable] = {}


def _make_rewriter_cls():
    from triton.runtime.interpreter import FunctionRewriter

    class _EmuFunctionRewriter(FunctionRewriter):

        def _transform_ast(self, src):
            tree = super()._transform_ast(src)
            tree = _InductionVarTransformer().visit(tree)
            ast.fix_missing_locations(tree)
            return tree

    return _EmuFunctionRewriter


def install_induction_vars(patcher: Patcher) -> None:
    from triton.runtime.interpreter import InterpretedFunction

    rewriter_cls = _make_rewriter_cls()

    def rewrite(self):
        # Separate cache: the stock InterpretedFunction.rewritten_fn cache keeps
        # the unmodified rewrite for use outside the block.
        fn = _EMU_REWRITTEN.get(self.fn)
        if fn is None:
            fn = rewriter_cls(self.fn, **self.kwargs).rewrite_ast()
            _EMU_REWRITTEN[self.fn] = fn
        return fn

    patcher.set_attr(InterpretedFunction, "rewrite", rewrite)
