"""Functions of the references and of the kernels that share a name share its signature: the arguments both
take come in the same positions (each side then adds its own: chunk_size, interpret and mxu_model for the
kernels; method and compute_dtype for the references)."""

import importlib
import inspect

import pytest

PAIRS = [("simple_gla", "chunk_simple_gla"), ("simple_gla", "chunk_simple_gla_bwd"), ("gla", "chunk_gla"),
         ("gla", "chunk_gla_bwd"), ("kda", "chunk_kda"), ("kda", "chunk_kda_bwd")]


def positional(fn) -> list[str]:
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in inspect.signature(fn).parameters.values() if p.kind in kinds]


def same_positions(reference, kernel) -> bool:
    """The arguments both take lead both signatures, in one order."""
    ref_args, kernel_args = positional(reference), positional(kernel)
    shared = [a for a in ref_args if a in kernel_args]
    return ref_args[:len(shared)] == kernel_args[:len(shared)] == shared


@pytest.mark.parametrize("op, name", PAIRS, ids=[n for _, n in PAIRS])
def test_a_shared_name_has_one_signature(op, name):
    reference = getattr(importlib.import_module(f"references.{op}"), name)
    kernel = getattr(importlib.import_module(f"kernels_tpu.{op}"), name)
    assert len(set(positional(reference)) & set(positional(kernel))) >= 5
    assert same_positions(reference, kernel), (positional(reference), positional(kernel))


def test_the_check_sees_a_reordered_argument():
    def reference(q, k, v, do, dht=None, g=None, scale=None):
        pass

    def kernel(q, k, v, do, g=None, scale=None, dht=None):  # the signature simple_gla's kernel had
        pass

    assert not same_positions(reference, kernel) and same_positions(reference, reference)
