"""Which dots outside Pallas kernels XLA:TPU puts on the MXU (harness/compile/xla_dots.py): the module text's tables read
on a hand-made module, and the compiler itself (libtpu, deviceless) on three probes whose answers differ."""

import jax.numpy as jnp
import pytest

from harness.compile import xla_dots

HLO = """HloModule jit_f

FileNames
1 "/src/model.py"
2 "/src/other.py"

FunctionNames
1 "f"

FileLocations
1 {file_name_id=1 function_name_id=1 line=10 end_line=10 column=1 end_column=9}
2 {file_name_id=2 function_name_id=1 line=22 end_line=22 column=1 end_column=9}
3 {file_name_id=1 function_name_id=1 line=30 end_line=30 column=1 end_column=9}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=1}
3 {file_location_id=3 parent_frame_id=1}

ENTRY %main {
  %convolution.1 = f32[64,128]{1,0} convolution(%a, %b), dim_labels=bf_io->bf, metadata={op_name="jit(f)/dot_general" stack_frame_id=1}
  %fusion.2 = f32[8,128]{1,0} fusion(%c), kind=kLoop, metadata={op_name="jit(f)/dot_general" stack_frame_id=3}
  %dot.3 = f32[8,8]{1,0} dot(%d, %e), metadata={op_name="jit(f)/dot_general" stack_frame_id=2}
  %custom-call.4 = f32[8,8]{1,0} custom-call(%f), custom_call_target="tpu_custom_call", metadata={stack_frame_id=3}
}
"""


def test_mxu_instructions_are_located_through_the_modules_tables():
    # the convolution (line 10) and the dot (other.py:22) are MXU instructions; the fusion at line 30 and the
    # kernel's custom call are not
    assert xla_dots.mxu_sites(HLO) == {("/src/model.py", 10), ("/src/other.py", 22)}
    assert xla_dots.mxu_sites("HloModule m\n") == frozenset()


def test_a_dot_runs_on_the_mxu_only_where_xla_kept_its_signatures_sites():
    here, there, elsewhere = ("/src/model.py", 10), ("/src/model.py", 30), ("/src/other.py", 5)
    vec = xla_dots.signature(jnp.zeros((8, 4, 128, 128)), jnp.zeros((8, 4, 128)), (((2,), (2,)), ((0, 1), (0, 1))),
                             None)
    mat = xla_dots.signature(jnp.zeros((64, 128)), jnp.zeros((128, 128)), (((1,), (0,)), ((), ())), None)
    both = xla_dots.signature(jnp.zeros((8, 8)), jnp.zeros((8, 8)), (((1,), (0,)), ((), ())), None)
    kernel = xla_dots.signature(jnp.zeros((16, 128)), jnp.zeros((128, 128)), (((1,), (0,)), ((), ())), "float32")
    dots = xla_dots.XlaDots(sites={vec: frozenset({there}), mat: frozenset({here}),
                                   both: frozenset({here, elsewhere})},
                            kernel=frozenset({kernel}), mxu=frozenset({here}))
    assert dots.on_mxu(mat) and not dots.on_mxu(vec)
    assert dots.on_mxu(kernel)  # a kernel's dot is Mosaic's: always the MXU
    assert dots.on_mxu(both)  # one of its sites on the MXU: rounded, and counted as mixed
    assert dots.on_mxu(xla_dots.signature(jnp.zeros((2, 2)), jnp.zeros((2, 2)), (((1,), (0,)), ((), ())), None))
    assert dots.summary() == {"outside_kernels": 3, "on_mxu": 1, "on_vpu_f32": ["model.py:30", "other.py:5"],
                              "mixed_signatures": 1}
    unread = xla_dots.XlaDots(reason="libtpu is not installed")
    assert unread.on_mxu(vec) and unread.summary() == {"unverified": "libtpu is not installed"}


def lone_matvec(s, k):
    return jnp.einsum("bhkv,bhk->bhv", s, k)


def decayed_matvec(s, k, g):
    s = s * jnp.exp(g)[..., None, None]  # XLA fuses this multiply and the einsum into an f32 multiply-reduce
    return jnp.einsum("bhkv,bhk->bhv", s, k)


@pytest.mark.parametrize("fn, shapes, on_mxu", [
    (lone_matvec, ((8, 4, 128, 128), (8, 4, 128)), 1),
    (decayed_matvec, ((8, 4, 128, 128), (8, 4, 128), (8, 4)), 0),
    (lambda a, b: a @ b, ((64, 128), (128, 128)), 1),
])
def test_the_compiler_decides_and_the_same_einsum_differs_by_what_surrounds_it(fn, shapes, on_mxu):
    dots = xla_dots.read(lambda args: fn(*args), (tuple(jnp.zeros(s) for s in shapes),), "v6e")
    assert not dots.reason, dots.reason
    assert len(dots.outside) == 1 and len(dots.outside & dots.mxu) == on_mxu, dots.summary()
