"""Ref reshapes in Pallas's TPU interpreter (jax 0.10 - 0.12; on jax 0.9 nothing is patched): a kernel may view a VMEM ref under another shape
(``ref.reshape(...)``, a ``ReshapeTransform``), which Mosaic compiles, but the interpreter cannot run.

The interpreter reads and writes kernel refs through two host callbacks, ``get`` and ``swap``
(``jax/_src/pallas/mosaic/interpret/interpret_pallas_call.py``); each turns the ref's transforms into one range
of the buffer (``utils.to_range``), which knows only indexers (``AttributeError: 'ReshapeTransform' object has
no attribute 'indices'``). vLLM TPU's GDN v3 kernel reshapes its VMEM refs to load rows lane-compact.

:func:`ref_reshapes` teaches both callbacks the reshape, exactly: the part of the transforms before the first
reshape is read as the range it is (the original callback), and the reshape with the indexers after it is applied
to that block in numpy, as views of a C-contiguous copy (a reshape that would copy raises: the view would not
alias the buffer). ``swap`` writes through the view and stores the whole block back with the original callback,
returning the old values, as ``swap`` does. Transforms without a reshape take the original path untouched. The
interpreter's DMA code calls the undecorated callbacks (``__wrapped__``); those are taught the same.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np


def _split(transforms, reshape_type):
    """(before, from the first reshape on), or None when there is no reshape."""
    for i, t in enumerate(transforms):
        if isinstance(t, reshape_type):
            return tuple(transforms[:i]), tuple(transforms[i:])
    return None


def _teach(base_get, base_swap):
    from jax._src.pallas.mosaic.interpret import utils
    from jax._src.state import indexing
    from jax._src.state.types import ReshapeTransform

    def view(block, post):
        out = block
        for t in post:
            if isinstance(t, ReshapeTransform):
                reshaped = out.reshape(t.shape)
                if not np.shares_memory(reshaped, block):
                    raise NotImplementedError(f"a ref reshape to {t.shape} of a non-contiguous view")
                out = reshaped
            elif isinstance(t, indexing.NDIndexer):
                out = out[tuple(utils._transform_slice_or_index(i) if isinstance(i, indexing.Slice) else int(i)
                                for i in t.indices)]
            else:
                raise NotImplementedError(f"a ref transform {type(t).__name__} after a reshape")
        return out

    def get(token, device_id, local_core_id, memory_space, buffer_id, transforms, *args, **kwargs):
        split = _split(transforms, ReshapeTransform)
        if split is None:
            return base_get(token, device_id, local_core_id, memory_space, buffer_id, transforms, *args, **kwargs)
        pre, post = split
        token, block = base_get(token, device_id, local_core_id, memory_space, buffer_id, pre, *args, **kwargs)
        return token, np.array(view(np.ascontiguousarray(block), post))

    def swap(token, device_id, local_core_id, memory_space, buffer_id, transforms, val, mask, **kwargs):
        split = _split(transforms, ReshapeTransform)
        if split is None:
            return base_swap(token, device_id, local_core_id, memory_space, buffer_id, transforms, val, mask,
                             **kwargs)
        pre, post = split
        token, block = base_get(token, device_id, local_core_id, memory_space, buffer_id, pre,
                                source_info=kwargs.get("source_info"))
        block = np.array(block, order="C", copy=True)
        target = view(block, post)
        old = np.array(target)
        target[...] = np.asarray(val) if mask is None else np.where(np.asarray(mask), np.asarray(val), old)
        token, _ = base_swap(token, device_id, local_core_id, memory_space, buffer_id, pre, block, None, **kwargs)
        return token, old

    return get, swap


def _taught_here(ipc) -> bool:
    """Whether this jax's interpreter has the callbacks :func:`_teach` knows: token first, decorated (jax 0.10 -
    0.12). jax 0.9's take no token and are not decorated; there ref reshapes stay unsupported, as jax left them."""
    import inspect

    return hasattr(ipc.get, "__wrapped__") and next(iter(inspect.signature(ipc.get).parameters)) == "token"


@contextlib.contextmanager
def ref_reshapes() -> Iterator[None]:
    """Pallas's TPU interpreter runs kernels that reshape refs, inside the block; restored after. On a jax whose
    interpreter :func:`_taught_here` does not know, the block runs as it is."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    if not _taught_here(ipc):
        yield
        return
    before = ipc.get, ipc.swap
    get, swap = _teach(*before)
    get.__wrapped__, swap.__wrapped__ = _teach(before[0].__wrapped__, before[1].__wrapped__)
    ipc.get, ipc.swap = get, swap
    try:
        yield
    finally:
        ipc.get, ipc.swap = before
