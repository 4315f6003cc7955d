"""``benchmarks/skinny_gemm_probe.skinny_matmul`` (a Mosaic GPU kernel for the verify forward's matmuls of
8-64 rows, benchmarks/NOTES.md item 46) on the CPU: the Mosaic GPU interpreter against XLA's product, CUDA
lowering at SmolLM2's shapes (shared memory), and its input checks."""

import functools
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import skinny_gemm_probe as sg  # noqa: E402


def _operands(T, K, N, seed=0):
    kx, kw = jax.random.split(jax.random.PRNGKey(seed))
    x = jax.random.normal(kx, (T, K), jnp.float32).astype(jnp.bfloat16)
    w = (jax.random.normal(kw, (N, K), jnp.float32) * K ** -0.5).astype(jnp.bfloat16)
    return x, w


@pytest.mark.parametrize("T,K,N,bn", [
    (8, 128, 64, 8),     # two K chunks, 8 CTAs
    (16, 192, 48, 16),   # three chunks: the 64-row A windows overlap the next chunks' rows
    (24, 256, 32, 32),   # four chunks 24 rows apart: the last window runs past what any chunk wrote
    (64, 128, 16, 8),    # T = 64: the windows do not overlap
])
def test_interpreter_matches_xla(T, K, N, bn):
    x, w = _operands(T, K, N)
    want = jnp.einsum("ti,oi->to", x, w, preferred_element_type=jnp.float32)
    got = sg.skinny_matmul(x, w, bn=bn, out_dtype=jnp.float32, interpret=True)
    assert got.shape == (T, N) and got.dtype == jnp.float32
    assert float(jnp.max(jnp.abs(got - want))) < 1e-4
    got16 = sg.skinny_matmul(x, w, bn=bn, interpret=True)
    assert got16.dtype == jnp.bfloat16 and bool(jnp.all(got16 == want.astype(jnp.bfloat16)))


@pytest.mark.parametrize("name", list(sg.SHAPES))
@pytest.mark.parametrize("T", [8, 16])
def test_lowers_for_cuda_at_smollm2_shapes(name, T):
    K, N = sg.SHAPES[name]
    f = jax.jit(functools.partial(sg.skinny_matmul, bn=sg.pick_bn(N), out_dtype=jnp.float32))
    f.trace(jax.ShapeDtypeStruct((T, K), jnp.bfloat16),
            jax.ShapeDtypeStruct((N, K), jnp.bfloat16)).lower(lowering_platforms=("cuda",))


def test_shared_memory_overflow_is_caught_by_lowering():
    f = jax.jit(functools.partial(sg.skinny_matmul, bn=64))
    with pytest.raises(ValueError, match="shared memory"):
        f.trace(jax.ShapeDtypeStruct((16, 1536), jnp.bfloat16),
                jax.ShapeDtypeStruct((576, 1536), jnp.bfloat16)).lower(lowering_platforms=("cuda",))


@pytest.mark.parametrize("T,K,N,bn", [(5, 128, 64, 8), (72, 128, 64, 8), (8, 100, 64, 8), (8, 128, 60, 8),
                                      (8, 128, 64, 12)])
def test_bad_shapes_say_what_is_expected(T, K, N, bn):
    x, w = _operands(T, K, N)
    with pytest.raises(ValueError, match="T % 8 == 0"):
        sg.skinny_matmul(x, w, bn=bn, interpret=True)


def test_pick_bn_gives_every_smollm2_matmul_at_least_72_ctas():
    picks = {name: sg.pick_bn(N) for name, (_, N) in sg.SHAPES.items()}
    assert picks == {"qkv": 8, "o": 8, "gate_up": 32, "down": 8}
    assert all(N // picks[n] >= 72 for n, (_, N) in sg.SHAPES.items())


def test_call_sites_share_one_lowered_kernel():
    """30 calls of ``jitted`` in one program lower to one Mosaic GPU custom call in one shared function (each
    call site of the bare entry would lower the kernel again: seconds per program at a forward's ~120 calls)."""
    K, N = sg.SHAPES["o"]
    ws = tuple(jax.ShapeDtypeStruct((N, K), jnp.bfloat16) for _ in range(30))
    text = sg._chain(sg.jitted(8)).trace(jax.ShapeDtypeStruct((8, K), jnp.bfloat16), ws, 2).lower(
        lowering_platforms=("cuda",)).as_text()
    assert text.count("custom_call @mosaic_gpu") == 1
