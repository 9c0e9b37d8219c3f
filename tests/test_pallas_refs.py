"""harness/emulation/pallas_refs.py: which interpreters it teaches ref reshapes to, and that it leaves others alone."""

import types

from harness.emulation import pallas_refs


def _interpreter(get):
    return types.SimpleNamespace(get=get, swap=lambda *a, **k: None)


def test_only_the_token_passing_decorated_callbacks_of_jax_0_10_to_0_12_are_taught():
    def undecorated(token, device_id, local_core_id, memory_space, buffer_id, transforms, **kwargs):
        return token, None

    def get_010(*args, **kwargs):  # a decorator's wrapper: inspect reads the signature of __wrapped__
        return undecorated(*args, **kwargs)

    get_010.__wrapped__ = undecorated
    assert pallas_refs._taught_here(_interpreter(get_010))

    def get_092(device_id, local_core_id, memory_space, buffer_id, transforms, **kwargs):  # jax 0.9: no token
        return None

    assert not pallas_refs._taught_here(_interpreter(get_092))

    def decorated_092(*args, **kwargs):  # decorated, but still without the token
        return get_092(*args, **kwargs)

    decorated_092.__wrapped__ = get_092
    assert not pallas_refs._taught_here(_interpreter(decorated_092))


def test_the_installed_interpreter_is_patched_inside_the_block_and_restored_after():
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    before = ipc.get, ipc.swap
    with pallas_refs.ref_reshapes():
        patched = (ipc.get, ipc.swap) != before
    assert (ipc.get, ipc.swap) == before
    assert patched == pallas_refs._taught_here(ipc)  # taught where it knows the callbacks, untouched elsewhere
