"""The one-launch row move of a draft tree's accepted path: Pallas interpreter, CUDA lowering and routing on CPU;
the real kernel under @pytest.mark.gpu."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import mesh as mesh_lib

from pallas_kernels import dispatch
from pallas_kernels.move_rows import move_rows, move_rows_reference
from specjax import cache as kv

pytestmark = pytest.mark.filterwarnings("ignore:.*Pallas Triton backend is deprecated")


def _arrays(n, shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.normal(size=shape), dtype) for _ in range(n))


# ragged starts; paths as the loop gives them (root 0, increasing nodes, padded with the last node)
START = jnp.asarray([3, 40], jnp.int32)
ROWS = jnp.asarray([[0, 2, 5, 9, 9], [0, 1, 4, 6, 11]], jnp.int32)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_interpreter_matches_reference(dtype):
    """R = 5 rows (padded to 8) of G = 3 kv heads (15 packed rows of 16): every array, both sequences; the slots
    the move reads from are also written by it (slot 5 of sequence 0), so reads must come before writes."""
    arrays = _arrays(4, (2, 64, 3, 64), dtype)
    got = move_rows(arrays, START, ROWS, interpret=True)
    want = move_rows_reference(arrays, START, ROWS)
    for g, w, a in zip(got, want, arrays):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
        assert not np.array_equal(np.asarray(g), np.asarray(a))  # something moved
    # the rows by hand, for one array: slot start + r holds what slot start + rows[r] held
    a, g = np.asarray(arrays[1]), np.asarray(got[1])
    for b in range(2):
        s = int(START[b])
        np.testing.assert_array_equal(g[b, s:s + 5], a[b, s + np.asarray(ROWS[b])])
        np.testing.assert_array_equal(g[b, :s], a[b, :s])
        np.testing.assert_array_equal(g[b, s + 5:], a[b, s + 5:])


def test_cache_gather_rows_is_the_reference_here():
    """On this CPU host ``cache.gather_rows`` runs XLA's ops, and they equal the kernel's reference."""
    arrays = _arrays(4, (2, 64, 3, 64), "bfloat16", seed=1)
    cache = kv.KVCache(k=arrays[:2], v=arrays[2:], lengths_B=START)
    moved = kv.gather_rows(cache, START, ROWS)
    for g, w in zip(moved.k + moved.v, move_rows_reference(arrays, START, ROWS)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_rejects_bad_inputs():
    arrays = _arrays(2, (2, 16, 3, 64), "bfloat16")
    with pytest.raises(ValueError, match="one shape and dtype"):
        move_rows(arrays + (jnp.zeros((2, 16, 3, 64), jnp.float32),), START, ROWS, interpret=True)
    with pytest.raises(ValueError, match="rows \\[B, R\\]"):
        move_rows(arrays, START, ROWS[:1], interpret=True)


def test_lowers_for_cuda_in_place():
    """SmolLM2's 60 cache arrays in one Triton kernel for an H200, every array aliased to an output."""
    sds = jax.ShapeDtypeStruct
    arrays = tuple(sds((1, 1024, 3, 64), jnp.bfloat16) for _ in range(60))
    h200 = mesh_lib.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu")
    with warnings.catch_warnings(), jax.sharding.use_abstract_mesh(
            mesh_lib.AbstractMesh((1,), ("x",), abstract_device=h200)):
        warnings.simplefilter("ignore", DeprecationWarning)
        text = jax.jit(lambda a, s, r: move_rows(a, s, r)).trace(
            arrays, sds((1,), jnp.int32), sds((1, 8), jnp.int32)).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("xla.gpu.triton") == 1 and text.count("output_operand_aliases") == 1
    assert text.count("operand_index = ") == 60


def test_gather_rows_routes_to_the_kernel_on_gpu(monkeypatch):
    """Traced only: on Hopper ``gather_rows`` is one ``move_rows`` kernel (no gathers); SPECJAX_MOVE_ROWS=0 and
    non-GPU backends keep XLA's ops."""
    from specjax import attention
    monkeypatch.setattr(attention, "_use_kernels", lambda: True)
    arrays = _arrays(4, (1, 32, 3, 64), "bfloat16")
    cache = kv.KVCache(k=arrays[:2], v=arrays[2:], lengths_B=START[:1])
    text = lambda: str(jax.make_jaxpr(lambda c: kv.gather_rows(c, START[:1], ROWS[:1]))(cache))
    assert "move_rows" not in text()  # this host's backend is the CPU
    monkeypatch.setattr(dispatch, "_gpu_backend", lambda: True)
    routed = text()
    assert "move_rows" in routed and "gather" not in routed
    monkeypatch.setenv("SPECJAX_MOVE_ROWS", "0")
    assert "move_rows" not in text()


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 2])
def test_gpu_matches_reference(B):
    arrays = _arrays(60, (B, 1024, 3, 64), "bfloat16", seed=B)
    start, rows = START[:B] + 500, ROWS[:B]
    want = jax.jit(move_rows_reference)(arrays, start, rows)
    got = jax.jit(move_rows)(arrays, start, rows)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
