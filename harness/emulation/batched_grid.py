"""Run every program of one Triton launch in one pass of the interpreter, bit for bit equal to its sequential loop.

triton 3.9's ``GridExecutor`` runs ``for x, y, z in grid: set_grid_idx(x, y, z); fn(**args)``: one Python pass over
the kernel per program, every builder operation on one block at a time. Here a launch's programs run *together*:

* **Program axis.** Every ``TensorHandle``'s data carries a leading program axis: ``(L, *block_shape)`` for a block,
  ``(L,)`` for a scalar, where ``L`` is the number of programs of the group that runs (values that differ between
  programs) or 1 (values every program shares: constants, ``tl.arange``, ``tl.num_programs``, arguments). numpy
  broadcasts the two kinds together, so elementwise builder operations (and the emulation's numerics patches:
  ``bf16_arith``, ``ptx_arith``, ``dots``, ``comparisons``) run once for the whole group, one numpy operation each.
  ``tl.program_id(axis)`` is the vector of the group's grid indices. Every builder method that reads a shape or an
  axis is wrapped (outermost, after the numerics patches) so that the program axis is kept: splat, unsplat,
  broadcast, reshape, expand_dims, trans/permute, cat, join, gather, ``tl.tensor.T``, reduce and scan axes (+1,
  ``axis=None`` reduced per program), make_range, loads and stores (pointer, mask and ``other`` broadcast to the
  group). A load gathers with numpy from the launch's argument storages and a store scatters into them (the bytes
  the interpreter's C++ load and store move; a load into a C-order array as the C++ load returns it: numpy's sums
  follow the memory order, so the layout matters). ``fmul``/``fadd``/``fsub`` get operands of one program-axis
  length, so ``ptx_arith``'s fusion of a product into an add (which asks for equal shapes) sees exactly what it
  sees per program. Pointer arithmetic is the stock uint64 sum, with fewer temporaries.
* **Control flow.** A Python ``if``/``while``/``range()``/``int()`` on a kernel value (``tl.tensor.__bool__``,
  ``__index__``, ``TensorHandle.__bool__``) asks every program of the group: when they agree the pass goes on;
  when they do not, :class:`Divergence` carries each program's value, the group's stores are undone (an undo log of
  the old values, replayed in reverse), and the group is split into sub-groups that agree, in sequential order,
  which run again from the start (and may split again). Varlen chunk counts, ``if i_t * BT >= T: return``, loop
  bounds loaded from ``cu_seqlens``: each splits by value. A kernel ``for`` loop (``range``/``tl.range``, with
  ``loop_vars``' tensor induction variables) splits by trip count (and induction type) only: programs with the
  same number of iterations run it together, each with its own start and step (fla's token-parallel kernels
  loop from a chunk's start to the token).
* **Memory order.** Programs of a launch may run in another interleaving than the sequential loop only if no
  program reads or writes what another program wrote, nor writes what another read. Every store records, per
  element of the launch's argument storages, the (sequential) index of the program that wrote it, its *owner*; a
  store or load by a program touching an element another program owns is a conflict, and so is one store in which
  two programs write one element. Reads are recorded (the lowest and highest program index that read an element)
  for the storages a launch both loads and stores: when a launch did, it is undone and run again with read
  tracking on those storages, and a store to an element another program read is a conflict too. A conflict undoes
  the launch and runs it sequentially. With no conflict, each element's loads see the launch's initial value or the
  same program's own earlier store, and its final value is one program's last store: the same as in any order of
  whole programs, so the same as the sequential loop.
* **Fallback.** Atomics (``create_atomic_*``: the sequential order of an atomic read-modify-write is observable),
  tensor descriptors, ``tl.device_print``, histograms, scaled dots, a failing ``device_assert``, an address outside
  the launch's argument storages, a storage accessed with two element sizes, a conflict, or any exception: the
  launch's stores are undone and it runs with the stock sequential loop (which raises whatever it raises).
* **Chunks.** At most ``max_programs`` programs run together (the program axis of every block of the pass is that
  long); a bigger grid runs as consecutive chunks in sequential order. Chunks of one launch are checked against
  each other like programs (the records span the launch), so chunking changes no bits.

Why the bits are equal: every operation a program performs is the same numpy operation on the same values as in its
own sequential pass, with an extra leading axis (elementwise ops are per element; reductions, scans and dots reduce
over block axes only, in the same order; ``np.matmul`` computes a stack of matrices one by one with the same
kernel), control flow is only taken where every program of the group takes it, and memory is checked as above.
The test module ``tests/test_batched_grid.py`` compares every GPU-leg metric with ``batched_grid=False``.

Each launch is recorded (kernel, grid, mode, groups, reason): ``batched`` (every program in one pass, or in chunks),
``split`` (diverged at least once), ``sequential`` (fell back; the reason says why).
"""

from __future__ import annotations

import inspect
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from .patcher import Patcher
from .ptx_arith import keep_product

DEFAULT_MAX_PROGRAMS = 512


class Divergence(Exception):
    """Programs of one group take different control flow; ``keys`` holds each program's value."""

    def __init__(self, keys):
        super().__init__("programs of a group diverge")
        self.keys = list(keys)


class Unbatchable(Exception):
    """Something the batched pass cannot do in the sequential loop's sense: the launch runs sequentially."""


class _State:
    """The group that runs now (one pass at a time: the interpreter keeps global state)."""

    def __init__(self) -> None:
        self.active = False
        self.coords: Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]] = None
        self.lin: Optional[np.ndarray] = None
        self.memory: Optional["_Memory"] = None


_STATE = _State()


def _lead(data) -> int:
    return data.shape[0] if getattr(data, "ndim", 0) else 1


def _to_lead(data: np.ndarray, n: int) -> np.ndarray:
    if _lead(data) == n:
        return data
    return np.broadcast_to(data, (n, ) + data.shape[1:])


def _find_signal(exc: BaseException):
    seen = 0
    while exc is not None and seen < 64:
        if isinstance(exc, (Divergence, Unbatchable)):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def _agree(keys: List[Any]):
    first = keys[0]
    for k in keys[1:]:
        if k != first:
            raise Divergence(keys)
    return first


class _Memory:
    """Undo log and per-element program records over a launch's argument storages (see the module doc).

    Writes are recorded as each element's *owner*, the one program that stored to it (-1: none did): two programs
    storing one element is a conflict, so one owner is all there is to record. Reads, where tracked, keep the lowest
    and highest program that read an element (many programs may read one element)."""

    def __init__(self, storages: List[Tuple[int, int]], track_reads=frozenset()) -> None:
        storages = sorted(set(storages))
        self.bases = np.array([b for b, _ in storages], dtype=np.uint64)
        self.ends = np.array([b + n for b, n in storages], dtype=np.uint64)
        self.undo: List[Tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.loaded: set = set()
        self.stored: set = set()
        self.track_reads = set(track_reads)
        self.itemsize: Dict[int, int] = {}
        self.owner: Dict[int, np.ndarray] = {}
        self.reads: Dict[int, Tuple[np.ndarray, np.ndarray]] = {}
        self.views: Dict[Tuple[int, str], np.ndarray] = {}

    def _locate(self, ptrs: np.ndarray, mask: Optional[np.ndarray], itemsize: int) -> Tuple[int, np.ndarray]:
        """The storage that holds every masked address (else Unbatchable) and those addresses as element indices
        there, flat in C order. ``mask`` None: every address."""
        addrs = ptrs if mask is None else ptrs[mask]
        sid = int(np.searchsorted(self.bases, addrs.flat[0], side="right")) - 1
        if sid < 0:
            raise Unbatchable("an access outside one argument storage of the launch")
        if self.itemsize.setdefault(sid, itemsize) != itemsize:
            raise Unbatchable("an argument storage accessed with two element sizes")
        base = self.bases[sid]
        if itemsize & (itemsize - 1) or int(base) & (itemsize - 1):
            raise Unbatchable("a misaligned access")
        # byte offsets, a fresh C-order array (one pass, also for a broadcast ``ptrs``); below the base they wrap to
        # huge offsets, caught by the range check
        off = np.subtract(addrs, base).reshape(-1)
        span = int((self.ends[sid] - base) // np.uint64(itemsize)) * itemsize
        bits = int(np.bitwise_or.reduce(off))  # >= every offset: one pass decides alignment and, mostly, range
        if bits & (itemsize - 1):
            raise Unbatchable("a misaligned access")
        if bits >= span and int(off.max()) >= span:
            raise Unbatchable("an access outside one argument storage of the launch")
        np.right_shift(off, np.uint64(itemsize.bit_length() - 1), out=off)
        return sid, off.view(np.int64)

    def _view(self, sid: int, np_dtype) -> np.ndarray:
        """The storage's bytes as a flat array of ``np_dtype`` (loads gather from it, stores and the undo log
        write to it)."""
        import ctypes

        key = (sid, np.dtype(np_dtype).str)
        v = self.views.get(key)
        if v is None:
            base, end = int(self.bases[sid]), int(self.ends[sid])
            size = np.dtype(np_dtype).itemsize
            raw = np.ctypeslib.as_array((ctypes.c_uint8 * (end - base)).from_address(base))
            v = raw[:(end - base) // size * size].view(np_dtype)
            self.views[key] = v
        return v

    def _elements(self, sid: int) -> int:
        return int((self.ends[sid] - self.bases[sid]) // np.uint64(self.itemsize[sid]))

    def _owners(self, sid: int) -> np.ndarray:
        m = self.owner.get(sid)
        if m is None:
            m = self.owner[sid] = np.full(self._elements(sid), -1, dtype=np.int32)
        return m

    def _read_maps(self, sid: int) -> Tuple[np.ndarray, np.ndarray]:
        m = self.reads.get(sid)
        if m is None:
            n = self._elements(sid)
            m = self.reads[sid] = (np.full(n, np.iinfo(np.int32).max, dtype=np.int32), np.full(n, -1, dtype=np.int32))
        return m

    @staticmethod
    def _programs(ptrs: np.ndarray, mask: Optional[np.ndarray]):
        """Which program performs each masked access (C order): an int32 array, one int when a single program
        performs them all, or None when one address block is shared by every program of a group of several
        (uniform pointers)."""
        lin = _STATE.lin
        lead = _lead(ptrs)
        if lead != len(lin):
            return int(lin[0]) if len(lin) == 1 else None
        if len(lin) == 1:
            return int(lin[0])
        per = ptrs.size // lead if mask is None else np.count_nonzero(mask.reshape(lead, -1), axis=1)
        return np.repeat(lin.astype(np.int32), per)

    def load(self, ptrs: np.ndarray, mask: Optional[np.ndarray], itemsize: int, np_dtype, other) -> np.ndarray:
        """What ``_interpreter.load(ptrs, mask, other)`` returns (the same bytes, gathered by numpy, C order as the
        C++ load returns them: numpy's reductions follow the memory order, so a layout changes the bits of a sum),
        after the conflict checks. ``mask`` None: every lane loads, ``other`` is not used."""
        if mask is not None and not mask.any():
            return self._filled(ptrs.shape, np_dtype, other)
        sid, idx = self._locate(ptrs, mask, itemsize)
        self.loaded.add(sid)
        owner = self.owner.get(sid)
        if owner is not None or sid in self.track_reads:
            progs = self._programs(ptrs, mask)
        if owner is not None:
            o = owner[idx]
            others = (o >= 0) if progs is None else (o >= 0) & (o != progs)
            if others.any():
                raise Unbatchable("a program reads what another program of the launch wrote")
        if sid in self.track_reads:
            rmin, rmax = self._read_maps(sid)
            lo, hi = (int(_STATE.lin[0]), int(_STATE.lin[-1])) if progs is None else (progs, progs)
            np.minimum.at(rmin, idx, lo)
            np.maximum.at(rmax, idx, hi)
        vals = self._view(sid, np_dtype)[idx]
        if mask is None:
            return vals.reshape(ptrs.shape)
        out = self._filled(ptrs.shape, np_dtype, other)
        out[mask] = vals
        return out

    @staticmethod
    def _filled(shape, np_dtype, other) -> np.ndarray:
        out = np.zeros(shape, dtype=np_dtype)
        if other is not None:
            out[...] = other
        return out

    def store(self, ptrs: np.ndarray, mask: Optional[np.ndarray], itemsize: int, np_dtype, values: np.ndarray) -> None:
        """``_interpreter.store(ptrs, values, mask)`` by numpy, after the conflict checks, logging the old values
        for :meth:`rollback`. ``values`` has the shape of ``ptrs``. An address stored twice by one program keeps
        the later value in C order, as the C++ store does: numpy's one-dimensional index assignment writes in index
        order (``tests/test_batched_grid.py`` holds it to that)."""
        if mask is not None and not mask.any():
            return
        sid, idx = self._locate(ptrs, mask, itemsize)
        progs = self._programs(ptrs, mask)
        if progs is None:
            raise Unbatchable("two programs of the launch write one address")  # every program, the same block
        self.stored.add(sid)
        if sid in self.reads:
            rmin, rmax = self.reads[sid]
            lo, hi = rmin[idx], rmax[idx]
            if ((hi >= 0) & ((lo != progs) | (hi != progs))).any():
                raise Unbatchable("a program writes what another program of the launch read")
        owner = self._owners(sid)
        o = owner[idx]
        if ((o >= 0) & (o != progs)).any():
            raise Unbatchable("two programs of the launch write one address")
        owner[idx] = progs
        if not isinstance(progs, int) and (owner[idx] != progs).any():  # two programs of this store, one address
            raise Unbatchable("two programs of the launch write one address")
        vals = values.reshape(-1) if mask is None else values[mask]
        if vals.dtype.itemsize != itemsize:
            raise Unbatchable("a stored value of another size than its pointer's element")
        view = self._view(sid, np_dtype)
        self.undo.append((view, idx, view[idx]))
        view[idx] = vals.view(np_dtype)

    def rollback(self, mark: int = 0) -> None:
        while len(self.undo) > mark:
            view, idx, old = self.undo.pop()
            view[idx] = old


def install_batched_grid(patcher: Patcher, record: Callable[[Dict[str, Any]], None],
                          max_programs: int = DEFAULT_MAX_PROGRAMS) -> None:
    """Replace ``GridExecutor.__call__`` and wrap the builder (outermost) as the module doc says. Call it after every
    numerics patch. ``record`` receives one dict per launch."""
    import triton
    import triton.language as tl
    import triton.runtime.interpreter as interp

    if max_programs < 1:
        raise ValueError("max_programs must be >= 1")
    TensorHandle = interp.TensorHandle
    builder = interp.interpreter_builder
    np_dtype_of = interp._get_np_dtype

    def active():
        return _STATE.active

    def wrap(name, fn_factory):
        orig = getattr(builder, name)
        batched = fn_factory(orig)

        def fn(*args, **kwargs):
            if not _STATE.active:
                return orig(*args, **kwargs)
            return batched(*args, **kwargs)

        patcher.set_attr(builder, name, fn)

    # ---- program ids, ranges, shapes
    wrap("create_get_program_id",
         lambda orig: lambda axis: TensorHandle(_STATE.coords[axis].astype(np.int32), tl.int32))
    wrap("create_make_range",
         lambda orig: lambda ret_ty, start, stop: TensorHandle(np.arange(start, stop, dtype=np.int32)[None], tl.int32))

    def splat(orig):

        def fn(ret_ty, arg):
            shape = tuple(ret_ty.shape)
            n = _lead(arg.data)
            vals = np.asarray(arg.data).reshape(n, -1)[:, 0]
            out = np.empty((n, ) + shape, dtype=np_dtype_of(arg.dtype))
            out[...] = vals.reshape((n, ) + (1, ) * len(shape))
            return TensorHandle(out, arg.dtype.scalar)

        return fn

    wrap("create_splat", splat)

    def unsplat(orig):

        def fn(arg):
            n = _lead(arg.data)
            vals = np.asarray(arg.data).reshape(n, -1)[:, 0]
            return TensorHandle(vals.astype(np_dtype_of(arg.dtype)), arg.dtype.scalar)

        return fn

    wrap("create_unsplat", unsplat)
    wrap("create_broadcast", lambda orig: lambda arg, shape: TensorHandle(
        np.broadcast_to(arg.data, (_lead(arg.data), ) + tuple(shape)), arg.dtype.scalar))
    wrap("create_reshape", lambda orig: lambda arg, shape, allow_reorder: TensorHandle(
        arg.data.reshape((_lead(arg.data), ) + tuple(shape)), arg.dtype.scalar))
    wrap("create_expand_dims",
         lambda orig: lambda arg, axis: TensorHandle(np.expand_dims(arg.data, axis + 1), arg.dtype.scalar))
    wrap("create_trans", lambda orig: lambda arg, perm: TensorHandle(
        np.transpose(arg.data, (0, ) + tuple(int(p) + 1 for p in perm)), arg.dtype.scalar))

    def two(fn2):

        def factory(orig):

            def fn(lhs, rhs, *rest):
                n = max(_lead(lhs.data), _lead(rhs.data))
                return fn2(_to_lead(lhs.data, n), _to_lead(rhs.data, n), lhs, *rest)

            return fn

        return factory

    wrap("create_cat", two(lambda a, b, lhs: TensorHandle(np.concatenate([a, b], axis=1), lhs.dtype.scalar)))
    wrap("create_join", two(lambda a, b, lhs: TensorHandle(np.stack([a, b], axis=-1), lhs.dtype.scalar)))
    wrap("create_gather", two(lambda a, b, lhs, axis: TensorHandle(np.take_along_axis(a, b, axis=axis + 1),
                                                                      lhs.dtype.scalar)))

    # ---- products and adds: one program-axis length, so ptx_arith's equal-shape fusion rule sees what it sees
    # per program
    def same_lead(orig):

        def fn(lhs, rhs):
            n = max(_lead(lhs.data), _lead(rhs.data))
            if _lead(lhs.data) != n:
                lhs = TensorHandle(_to_lead(lhs.data, n), lhs.dtype, lhs.attr)
            if _lead(rhs.data) != n:
                rhs = TensorHandle(_to_lead(rhs.data, n), rhs.dtype, rhs.attr)
            return orig(lhs, rhs)

        return fn

    for name in ("create_fmul", "create_fadd", "create_fsub"):
        wrap(name, same_lead)

    # ---- pointer arithmetic: the stock ``ptr + bytes * offset.astype(uint64)`` (the same uint64 wrap-around), with
    # the product computed in place of the cast and the sum in place of the product: a group's pointer blocks are
    # the biggest arrays of the pass
    def addptr(orig):

        def batched_addptr(ptr, offset):
            step = np.uint64(max(1, ptr.get_element_ty().primitive_bitwidth // 8))
            off = np.multiply(offset.data, step, dtype=np.uint64, casting="unsafe")
            if np.broadcast(ptr.data, off).shape == off.shape:
                return TensorHandle(np.add(ptr.data, off, out=off), ptr.dtype)
            return TensorHandle(ptr.data + off, ptr.dtype)

        return batched_addptr

    wrap("create_addptr", addptr)

    # ---- memory
    def masked_load(orig):

        def fn(ptrs, mask, other, cache_policy, is_volatile):
            n = max(_lead(ptrs.data), _lead(mask.data), 1 if other is None else _lead(other.data))
            p = _to_lead(ptrs.data, n)
            m = None if mask.data.all() else np.broadcast_to(_to_lead(mask.data, n), p.shape)
            dtype_tt = ptrs.get_element_ty()
            data = _STATE.memory.load(p, m, max(1, dtype_tt.primitive_bitwidth // 8), np_dtype_of(dtype_tt),
                                      None if other is None else _to_lead(other.data, n))
            return TensorHandle(data, dtype_tt)

        return fn

    wrap("create_masked_load", masked_load)

    def masked_store(orig):

        def fn(ptrs, value, mask, cache_policy):
            n = max(_lead(ptrs.data), _lead(value.data), _lead(mask.data))
            p = _to_lead(ptrs.data, n)
            m = None if mask.data.all() else np.broadcast_to(_to_lead(mask.data, n), p.shape)
            dtype_tt = ptrs.get_element_ty()
            _STATE.memory.store(p, m, max(1, dtype_tt.primitive_bitwidth // 8), np_dtype_of(dtype_tt),
                                np.broadcast_to(_to_lead(value.data, n), p.shape))

        return fn

    wrap("create_masked_store", masked_store)

    def refuse(reason):

        def factory(orig):

            def fn(*args, **kwargs):
                raise Unbatchable(reason)

            return fn

        return factory

    for name in sorted(n for n in dir(type(builder)) if n.startswith("create_atomic")):
        wrap(name, refuse("atomics keep the sequential order"))
    for name in ("create_make_tensor_descriptor", "create_descriptor_load", "create_descriptor_store",
                 "create_descriptor_gather", "create_descriptor_scatter"):
        if hasattr(builder, name):
            wrap(name, refuse("tensor descriptors"))
    for name, why in (("create_print", "device_print"), ("create_histogram", "histogram"),
                      ("create_dot_scaled", "scaled dot"), ("create_inline_asm", "inline asm"),
                      ("create_extern_elementwise", "extern elementwise")):
        if hasattr(builder, name):
            wrap(name, refuse(why))

    def checked(orig):

        def fn(condition, *rest):
            if not bool(np.all(condition.data)):
                raise Unbatchable("a device assert fails in some program")

        return fn

    wrap("create_assert", checked)
    wrap("create_assume", checked)

    # ---- control flow on kernel values
    stock_handle_bool = TensorHandle.__bool__

    def handle_bool(self):
        if not _STATE.active or _lead(self.data) == 1:
            return stock_handle_bool(self)
        per = np.asarray(self.data).reshape(_lead(self.data), -1).all(axis=1)
        return _agree([bool(v) for v in per])

    patcher.set_attr(TensorHandle, "__bool__", handle_bool)

    # ---- kernel loops (loop_vars' tensor induction variables): programs whose ``range`` has the same trip count
    # (and induction type) run the loop together, each with its own start and step; a trip count that differs
    # splits the group, as any other divergence
    from . import loop_vars

    stock_range = loop_vars.tensor_range

    def tensor_range(range_fn, *args, **kwargs):
        per = [a for a in args if isinstance(a, tl.tensor) and _lead(a.handle.data) > 1]
        if not _STATE.active or not per or any(a.handle.data.size != _lead(a.handle.data) for a in per):
            yield from stock_range(range_fn, *args, **kwargs)
            return
        n = _lead(per[0].handle.data)
        if any(_lead(a.handle.data) != n for a in per):
            yield from stock_range(range_fn, *args, **kwargs)
            return

        def arg(a, i):
            if isinstance(a, tl.tensor):
                d = a.handle.data
                return int(d[i] if _lead(d) > 1 else d.reshape(-1)[0])
            return a

        ranges = [range_fn(*[arg(a, i) for a in args], **kwargs) for i in range(n)]
        if not all(isinstance(r, range) for r in ranges):
            yield from stock_range(range_fn, *args, **kwargs)
            return
        wide_args = any(isinstance(a, tl.tensor) and a.dtype in (tl.int64, tl.uint64) for a in args)
        keys = [(len(r), wide_args or not all(-2**31 <= v < 2**31 for v in (r.start, r.stop, r.step)))
                for r in ranges]
        trips, wide = _agree(keys)
        ty, npty = (tl.int64, np.int64) if wide else (tl.int32, np.int32)
        starts = np.array([r.start for r in ranges], dtype=np.int64)
        steps = np.array([r.step for r in ranges], dtype=np.int64)
        uniform = bool((starts == starts[0]).all() and (steps == steps[0]).all())
        for k in range(trips):
            vals = starts[:1] + k * steps[:1] if uniform else starts + k * steps
            yield tl.tensor(TensorHandle(vals.astype(npty), ty), ty)

    patcher.set_attr(loop_vars, "tensor_range", tensor_range)

    stock_patch_lang_tensor = interp._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        stock_patch_lang_tensor(tensor, scope)
        s_index, s_bool, s_T = tensor.__index__, tensor.__bool__, tensor.T

        def index(self):
            data = self.handle.data
            if not _STATE.active or _lead(data) == 1:
                return s_index(self)
            return _agree([int(np.asarray(row).squeeze()) for row in data])

        def to_bool(self):
            data = self.handle.data
            if not _STATE.active:
                return s_bool(self)
            n = _lead(data)
            if data.size // max(n, 1) != 1:
                return True  # a block: truthy, like the stock rule
            return _agree([bool(v) for v in np.asarray(data).reshape(n)])

        def transpose(self):
            if not _STATE.active:
                return s_T.fget(self)
            data = self.handle.data
            h = TensorHandle(np.transpose(data, (0, ) + tuple(range(data.ndim - 1, 0, -1))), self.handle.dtype)
            shape = list(self.type.shape)
            shape[-1], shape[-2] = shape[-2], shape[-1]
            return tl.core.tensor(h, tl.core.block_type(self.dtype, shape))

        scope.set_attr(tensor, "__index__", index)
        scope.set_attr(tensor, "__bool__", to_bool)
        scope.set_attr(tensor, "T", property(transpose))

    patcher.set_attr(interp, "_patch_lang_tensor", patch_lang_tensor)

    # ---- reductions and scans (subclasses of the classes in place now: bf16_arith's, when installed)
    def batched_ops(base, has_keep):

        class Batched(base):

            def to_tensor(self, ret, dtype):
                if not _STATE.active or not (hasattr(ret, "shape") and getattr(ret, "ndim", 0) >= 1):
                    return super().to_tensor(ret, dtype)
                data = ret.astype(np_dtype_of(dtype))
                shape = list(data.shape[1:])
                ty = tl.block_type(dtype, shape) if shape else dtype
                return tl.core.tensor(TensorHandle(data, dtype.scalar), ty)

            def apply(self, input):
                if not _STATE.active:
                    return super().apply(input)
                if not isinstance(input, tuple):
                    return self.apply((input, ))[0]
                self.check_tensor(input)
                axis, keep = self.axis, getattr(self, "keep_dims", False)
                ndim = len(input[0].shape)
                try:
                    if axis is None:
                        flat = []
                        for t in input:
                            d = t.handle.data
                            flat.append(tl.core.tensor(keep_product(t.handle, TensorHandle(d.reshape(_lead(d), -1),
                                                                                           t.handle.dtype)),
                                                       tl.block_type(t.dtype, [int(np.prod(t.shape))])))
                        input = tuple(flat)
                        self.axis = 1
                        if has_keep:
                            self.keep_dims = False
                    else:
                        self.axis = (axis + ndim if axis < 0 else axis) + 1
                    ret = self.apply_impl(input)
                    ret = tuple(ret) if isinstance(ret, (list, tuple)) else (ret, )
                finally:
                    self.axis = axis
                    if has_keep:
                        self.keep_dims = keep
                if axis is None and keep:
                    out = []
                    for t in ret:
                        d = t.handle.data
                        out.append(tl.core.tensor(TensorHandle(d.reshape((_lead(d), ) + (1, ) * ndim), t.handle.dtype),
                                                  tl.block_type(t.dtype, [1] * ndim)))
                    ret = tuple(out)
                return ret

        Batched.__name__ = "Batched" + base.__name__
        return Batched

    patcher.set_attr(interp, "ReduceOps", batched_ops(interp.ReduceOps, True))
    patcher.set_attr(interp, "ScanOps", batched_ops(interp.ScanOps, False))

    # ---- the executor
    GridExecutor = interp.GridExecutor

    def storages_of(values) -> List[Tuple[int, int]]:
        out = []

        def walk(v):
            if isinstance(v, dict):
                for x in v.values():
                    walk(x)
            elif isinstance(v, (tuple, list)):
                for x in v:
                    walk(x)
            elif hasattr(v, "base") and hasattr(v, "strides") and hasattr(v, "block_shape"):
                walk(v.base)
            elif hasattr(v, "untyped_storage"):
                s = interp._unwrap_tensor(v).untyped_storage()
                if s.nbytes():
                    out.append((s.data_ptr(), s.nbytes()))
            elif hasattr(v, "base") and hasattr(v.base, "untyped_storage"):  # TensorWrapper
                walk(v.base)

        walk(values)
        return out

    def run_batched(fn, args, grid, storages, track_reads) -> Tuple[str, int, Optional[str], "_Memory"]:
        gx, gy, gz = grid
        total = gx * gy * gz
        lin = np.arange(total, dtype=np.int64)
        coords = (lin // (gy * gz), (lin // gz) % gy, lin % gz)
        memory = _Memory(storages, track_reads)
        queue = [lin[i:i + max_programs] for i in range(0, total, max_programs)]
        groups, split = 0, False
        _STATE.memory = memory
        try:
            while queue:
                group = queue.pop(0)
                mark = len(memory.undo)
                _STATE.lin = group
                _STATE.coords = tuple(c[group] for c in coords)
                _STATE.active = True
                try:
                    fn(**args)
                except Exception as e:  # noqa: BLE001 - every failure is judged below
                    _STATE.active = False
                    sig = _find_signal(e)
                    if isinstance(sig, Divergence) and len(sig.keys) == len(group):
                        memory.rollback(mark)
                        split = True
                        order: Dict[Any, List[int]] = {}
                        for i, k in enumerate(sig.keys):
                            order.setdefault(k, []).append(i)
                        queue[:0] = [group[np.array(ix)] for ix in order.values()]
                        continue
                    memory.rollback(0)
                    reason = str(sig) if isinstance(sig, Unbatchable) else f"{type(e).__name__} in the batched pass"
                    return "sequential", groups, reason, memory
                finally:
                    _STATE.active = False
                groups += 1
        finally:
            _STATE.active = False
            _STATE.memory = None
            _STATE.lin = _STATE.coords = None
        return ("split" if split else "batched"), groups, None, memory

    def __call__(self, *args_dev, **kwargs):
        argspec = inspect.getfullargspec(self.fn)
        kwargs = {k: v for k, v in kwargs.items() if k in argspec.args or k in argspec.kwonlyargs}
        args_hst, kwargs_hst = self._init_args_hst(args_dev, kwargs)
        for hook in self.pre_run_hooks:
            hook(*args_hst, **kwargs_hst)
        patch_scope = interp._patch_lang(self.fn)
        try:
            args = inspect.getcallargs(self.fn, *args_hst, **kwargs_hst)
            args = {name: arg if name in self.constexprs else interp._implicit_cvt(arg) for name, arg in args.items()}
            grid = self.grid(args) if callable(self.grid) else self.grid
            assert len(grid) <= 3, "grid must have at most 3 dimensions"
            grid = tuple(int(g) for g in grid) + (1, ) * (3 - len(grid))
            interp.interpreter_builder.set_grid_dim(*grid)
            interp.interpreter_builder.set_grid_idx(0, 0, 0) if all(grid) else None
            storages = storages_of((args_hst, kwargs_hst))
            name = getattr(self.fn, "__name__", "?")
            rec = {"kernel": name, "grid": list(grid), "programs": grid[0] * grid[1] * grid[2]}
            t0 = time.perf_counter()
            mode, groups, reason = "batched", 0, None
            if rec["programs"]:
                mode, groups, reason, memory = run_batched(self.fn, args, grid, storages, ())
                both = memory.loaded & memory.stored
                if mode != "sequential" and both:
                    # this launch loads what it stores: run it again, recording reads on those storages
                    memory.rollback(0)
                    mode, groups, reason, memory = run_batched(self.fn, args, grid, storages, both)
                    rec["read_tracked"] = True
            if mode == "sequential":
                try:
                    for x in range(grid[0]):
                        for y in range(grid[1]):
                            for z in range(grid[2]):
                                interp.interpreter_builder.set_grid_idx(x, y, z)
                                self.fn(**args)
                except Exception as e:
                    if triton.knobs.compilation.front_end_debugging:
                        raise
                    raise interp.InterpreterError(repr(e)) from e
            rec.update(mode=mode, groups=groups, reason=reason, seconds=round(time.perf_counter() - t0, 4))
            record(rec)
        finally:
            patch_scope.restore()
        self._restore_args_dev(args_dev, args_hst, kwargs, kwargs_hst)

    patcher.set_attr(GridExecutor, "__call__", __call__)


def summarize(launches: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Counts per mode and the reasons of the sequential ones, for a row's details."""
    counts = {"batched": 0, "split": 0, "sequential": 0}
    reasons, split = set(), set()
    for r in launches:
        counts[r["mode"]] = counts.get(r["mode"], 0) + 1
        if r["mode"] == "sequential":
            reasons.add(f"{r['kernel']}: {r['reason']}")
        elif r["mode"] == "split":
            split.add(r["kernel"])
    return {**counts, "sequential_reasons": sorted(reasons), "split_kernels": sorted(split)}
