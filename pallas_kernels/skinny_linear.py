"""Skinny matmuls for decode and verify (M = B * T <= 16 rows), with the layer's small ops fused in,
in Pallas on the Triton backend.

Why. At B = 1 a Llama decode step is launch-bound: XLA runs ~16 kernels per layer (norm, GEMV,
RoPE, two cache writes, ...) of 1-3 us each. These kernels do a layer in four matmul launches plus
attention, each with its neighbours fused in:

  ``norm_qkv_rope``  RMSNorm -> q/k/v projection (+ bias) -> RoPE; k and v are written into the KV
                     cache in place (aliased), q is returned
  ``linear_residual``  residual + x @ w.T                    (o projection, down projection)
  ``norm_swiglu``      silu(norm(x) @ w_gate.T) * (norm(x) @ w_up.T)
  ``norm_linear``      norm(x) @ w.T                         (final norm + LM head)

Work. One program per ``block_n`` output features (rope: per head and per part of its rotary
pairs; swiglu: per block of gate rows and the matching up rows). It loops over the input features
in chunks of ``block_k`` (a masked tail: no divisibility asked of the input width) and, for each chunk,
over the M rows: the weight tile is loaded once and reused by every row.

Exactness. Every row's arithmetic (its norm statistics, its products, its reduction over the
chunk, the order of the chunks) depends only on that row and the static shapes of one tile, never on
M: a decode step (M = B) and a speculative verify (M = B * (K + 1)) give bitwise the same output for
the same row. With the attention kernel (``decode_attention``, same property) a whole verify
forward then reproduces the decode forward's logits bit for bit.

Numerics as ``specjax.layers`` in ``compute_dtype="param"``: activations and residual float32, norm
statistics in float32, the normalised activation rounded to the weight dtype before the product,
products and sums in float32.

Outcome (H200, benchmarks/NOTES.md item 10): faster than XLA's ops one by one at M = 1 with the
weights in L2, but not in the decode loop (weights from HBM, too few bytes in flight per kernel):
SmolLM2 B=1 0.836 vs 0.786 ms/token; and 2-5x slower than XLA at M = 8, where each row repeats the
per-chunk sums. So the model uses them only when asked (``SPECJAX_FUSED=1``), for the exactness.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

MAX_ROWS = 16  # largest M = B * T these kernels take (the rows are an unrolled loop)

warnings.filterwarnings("ignore", message="The Pallas Triton backend is deprecated", category=DeprecationWarning)


def _pow2(n) -> bool:
    return isinstance(n, int) and n > 0 and n & (n - 1) == 0


@dataclasses.dataclass(frozen=True)
class TuningConfig:
    """Tile sizes and launch parameters (none may depend on M: exactness, module doc)."""
    block_n: int = 4       # output features per program (one weight row per warp at num_warps = block_n)
    block_k: int = 256     # input features per loop step
    num_warps: int = 4
    num_stages: int = 3    # Triton software-pipelining depth: weight chunks in flight per program

    def __post_init__(self):
        if not (_pow2(self.block_n) and 2 <= self.block_n <= 64):
            raise ValueError(f"block_n must be a power of two in [2, 64], got {self.block_n}")
        if not (_pow2(self.block_k) and 16 <= self.block_k <= 2048):
            raise ValueError(f"block_k must be a power of two in [16, 2048], got {self.block_k}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps}")
        if not (isinstance(self.num_stages, int) and 1 <= self.num_stages <= 8):
            raise ValueError(f"num_stages must be an int in [1, 8], got {self.num_stages}")


# ------------------------------------------------------------------------------------- kernel core
def _i(m: int):
    """A static row index as an int32 scalar (ref indexers take it in the interpreter and on GPU)."""
    return jnp.int32(m)


def _inv_rms(x_ref, m, I, bk, eps):
    """1 / rms of row m (float32), the squares summed chunk by chunk."""
    def step(c, s):
        k = c * bk + lax.broadcasted_iota(jnp.int32, (bk,), 0)
        x = plgpu.load(x_ref.at[_i(m), pl.ds(c * bk, bk)], mask=k < I, other=0.0).astype(jnp.float32)
        return s + jnp.sum(x * x)
    ss = lax.fori_loop(0, pl.cdiv(I, bk), step, jnp.zeros((), jnp.float32))
    return lax.rsqrt(ss / I + eps)


def _row_products(x_ref, g_ref, w_ref, starts, *, M, I, bn, bk, eps):
    """acc[m][p] = (norm(x[m]) if g_ref else x[m]) . w[starts[p] : starts[p] + bn]^T, float32 [bn].

    The weight tile of a chunk is loaded once and used by every row; each row's products and sums
    are the same operations on the same tile shapes whatever M is (exactness, module doc). With
    block_k = 256 one warp spans a tile row (8 bf16 per thread), so the sums stay inside a warp."""
    inv = [_inv_rms(x_ref, m, I, bk, eps) for m in range(M)] if g_ref is not None else None
    wdt = w_ref.dtype

    def chunk(c, accs):
        kmask = c * bk + lax.broadcasted_iota(jnp.int32, (bk,), 0) < I
        tiles = [plgpu.load(w_ref.at[pl.ds(s, bn), pl.ds(c * bk, bk)],
                            mask=jnp.broadcast_to(kmask[None, :], (bn, bk)), other=0.0).astype(jnp.float32)
                 for s in starts]
        if g_ref is not None:
            g = plgpu.load(g_ref.at[pl.ds(c * bk, bk)], mask=kmask, other=0.0).astype(jnp.float32)
        out = []
        for m in range(M):
            x = plgpu.load(x_ref.at[_i(m), pl.ds(c * bk, bk)], mask=kmask, other=0.0).astype(jnp.float32)
            if g_ref is not None:
                x = (x * inv[m]) * g
            x = x.astype(wdt).astype(jnp.float32)          # the matmul operand, as layers.linear
            out.append(tuple(a + jnp.sum(t * x[None, :], axis=1) for a, t in zip(accs[m], tiles)))
        return tuple(out)

    zero = tuple(jnp.zeros((bn,), jnp.float32) for _ in starts)
    return lax.fori_loop(0, pl.cdiv(I, bk), chunk, tuple(zero for _ in range(M)))


# ------------------------------------------------------------------------------------- kernels
def _linear_kernel(*refs, M, I, bn, bk, eps, norm, residual):
    """One program = output features [pid * bn, +bn): o = (r +) norm?(x) @ w.T."""
    x_ref, refs = refs[0], refs[1:]
    g_ref, refs = (refs[0], refs[1:]) if norm else (None, refs)
    w_ref, refs = refs[0], refs[1:]
    r_ref, o_ref = (refs[0], refs[1]) if residual else (None, refs[0])
    n0 = pl.program_id(0) * bn
    accs = _row_products(x_ref, g_ref, w_ref, (n0,), M=M, I=I, bn=bn, bk=bk, eps=eps)
    for m in range(M):
        y = accs[m][0]
        if residual:
            y = r_ref[_i(m), pl.ds(n0, bn)] + y
        o_ref[_i(m), pl.ds(n0, bn)] = y


def _swiglu_kernel(x_ref, g_ref, w_ref, o_ref, *, M, I, F, bn, bk, eps):
    """One program = hidden features [pid * bn, +bn): silu(gate) * up, gate rows n, up rows F + n, of the
    normed rows (as ``layers.norm_swiglu`` at several rows)."""
    n0 = pl.program_id(0) * bn
    accs = _row_products(x_ref, g_ref, w_ref, (n0, F + n0), M=M, I=I, bn=bn, bk=bk, eps=eps)
    for m in range(M):
        gate, up = accs[m]
        o_ref[_i(m), pl.ds(n0, bn)] = gate * (1.0 / (1.0 + jnp.exp(-gate))) * up


def _qkv_kernel(*refs, M, T, I, H, G, d, bn, bk, eps, bias):
    """One program = (head h of the H + G + G q/k/v heads, part j): the rotary pairs
    (j * bn + i, d / 2 + j * bn + i), i < bn, of that head. q heads -> q_ref [M, H * d]; k and v heads
    are stored at cache slot pos[m] of sequence m // T (rows past the cache's end are dropped)."""
    x_ref, g_ref, w_ref, refs = refs[0], refs[1], refs[2], refs[3:]
    b_ref, refs = (refs[0], refs[1:]) if bias else (None, refs)
    cos_ref, sin_ref, pos_ref, _, _, q_ref, k_ref, v_ref = refs  # the two cache inputs alias k_ref, v_ref
    h, j = pl.program_id(0), pl.program_id(1)
    c0 = j * bn                                            # column of the first half inside the head
    lo, hi = h * d + c0, h * d + d // 2 + c0
    accs = _row_products(x_ref, g_ref, w_ref, (lo, hi), M=M, I=I, bn=bn, bk=bk, eps=eps)
    S = k_ref.shape[1]
    for m in range(M):
        a1, a2 = accs[m]
        if b_ref is not None:
            a1 = a1 + b_ref[pl.ds(lo, bn)].astype(jnp.float32)
            a2 = a2 + b_ref[pl.ds(hi, bn)].astype(jnp.float32)
        cos, sin = cos_ref[_i(m), pl.ds(c0, bn)], sin_ref[_i(m), pl.ds(c0, bn)]
        r1, r2 = a1 * cos - a2 * sin, a2 * cos + a1 * sin  # HF rotate-half

        @pl.when(h < H)
        def _():
            q_ref[_i(m), pl.ds(lo, bn)] = r1
            q_ref[_i(m), pl.ds(hi, bn)] = r2

        pos, b = pos_ref[_i(m)], _i(m // T)
        ok = jnp.broadcast_to(pos < S, (bn,))
        for ref, first, y1, y2 in ((k_ref, H, r1, r2), (v_ref, H + G, a1, a2)):
            @pl.when((h >= first) & (h < first + G))
            def _():
                g = h - first
                plgpu.store(ref.at[b, pos, g, pl.ds(c0, bn)], y1.astype(ref.dtype), mask=ok)
                plgpu.store(ref.at[b, pos, g, pl.ds(d // 2 + c0, bn)], y2.astype(ref.dtype), mask=ok)


# ------------------------------------------------------------------------------------- builders
def _compiler(cfg: TuningConfig):
    return plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def _check(x_MI, w_NI, n_tiles_of: int | None, what: str, cfg: TuningConfig):
    (M, I), (N, Iw) = x_MI.shape, w_NI.shape
    if not 1 <= M <= MAX_ROWS:
        raise ValueError(f"{what}: takes 1..{MAX_ROWS} rows (B * T), got x of shape {x_MI.shape}")
    if I != Iw:
        raise ValueError(f"{what}: x [M, I] and w [N, I] disagree on I: {x_MI.shape} vs {w_NI.shape}")
    if n_tiles_of is not None and n_tiles_of % cfg.block_n:
        raise ValueError(f"{what}: {n_tiles_of} output features are not a multiple of block_n={cfg.block_n}")
    return M, I, N


def _call(kernel, grid, out_shape, cfg, interpret, name, aliases=None):
    return pl.pallas_call(kernel, grid=grid, out_shape=out_shape, compiler_params=_compiler(cfg),
                          input_output_aliases=aliases or {}, interpret=interpret, name=name)


@functools.partial(jax.jit, static_argnames=("eps", "config", "interpret"))
def norm_linear(x_MI, g_I, w_NI, *, eps: float, config: TuningConfig | None = None, interpret: bool = False):
    """``rms_norm(x, g) @ w.T`` as float32 [M, N] (the final norm + LM head)."""
    cfg = config or TuningConfig()
    M, I, N = _check(x_MI, w_NI, w_NI.shape[0], "norm_linear", cfg)
    kern = functools.partial(_linear_kernel, M=M, I=I, bn=cfg.block_n, bk=cfg.block_k, eps=eps, norm=True,
                             residual=False)
    return _call(kern, (N // cfg.block_n,), jax.ShapeDtypeStruct((M, N), jnp.float32), cfg, interpret,
                 "norm_linear")(x_MI, g_I, w_NI)


@functools.partial(jax.jit, static_argnames=("config", "interpret"))
def linear_residual(x_MI, w_NI, r_MN, *, config: TuningConfig | None = None, interpret: bool = False):
    """``r + x @ w.T`` as float32 [M, N] (the o and down projections with their residual add)."""
    cfg = config or TuningConfig()
    M, I, N = _check(x_MI, w_NI, w_NI.shape[0], "linear_residual", cfg)
    if r_MN.shape != (M, N):
        raise ValueError(f"linear_residual: residual must be [M, N] = {(M, N)}, got {r_MN.shape}")
    kern = functools.partial(_linear_kernel, M=M, I=I, bn=cfg.block_n, bk=cfg.block_k, eps=0.0, norm=False,
                             residual=True)
    return _call(kern, (N // cfg.block_n,), jax.ShapeDtypeStruct((M, N), jnp.float32), cfg, interpret,
                 "linear_residual")(x_MI, w_NI, r_MN.astype(jnp.float32))


@functools.partial(jax.jit, static_argnames=("eps", "config", "interpret"))
def norm_swiglu(x_MI, g_I, w_2FI, *, eps: float, config: TuningConfig | None = None, interpret: bool = False):
    """``silu(n @ w_gate.T) * (n @ w_up.T)`` with ``n = rms_norm(x, g)``, float32 [M, F]; ``w_2FI`` holds the
    gate rows then the up rows (the model's fused ``w_gate_up``). As in ``layers.norm_swiglu`` at several rows
    (since 2026-12-06, benchmarks/NOTES.md item 48), the matmul operand is the normed row rms_norm(x, g), rounded
    to the weights' dtype."""
    cfg = config or TuningConfig()
    if w_2FI.shape[0] % 2:
        raise ValueError(f"norm_swiglu: w_gate_up must have 2F rows, got {w_2FI.shape}")
    F = w_2FI.shape[0] // 2
    M, I, _ = _check(x_MI, w_2FI, F, "norm_swiglu", cfg)
    kern = functools.partial(_swiglu_kernel, M=M, I=I, F=F, bn=cfg.block_n, bk=cfg.block_k, eps=eps)
    return _call(kern, (F // cfg.block_n,), jax.ShapeDtypeStruct((M, F), jnp.float32), cfg, interpret,
                 "norm_swiglu")(x_MI, g_I, w_2FI)


@functools.partial(jax.jit, static_argnames=("n_heads", "eps", "config", "interpret"))
def norm_qkv_rope(x_MI, g_I, w_NI, b_N, cos_Md, sin_Md, pos_M, k_BSGd, v_BSGd, *, n_heads: int, eps: float,
                  config: TuningConfig | None = None, interpret: bool = False):
    """q/k/v projection of ``rms_norm(x, g)`` (+ ``b_N`` unless None) with RoPE on q and k.

    ``cos_Md`` / ``sin_Md`` are HF rotate-half tables (``layers.rope_tables``: both halves equal; the
    kernel reads the first half only).

    Rows are ``m = b * T + t`` (B = k_BSGd.shape[0] sequences, T = M / B). Returns ``(q_MQ, k, v)``: q
    float32 [M, n_heads * d] rotated; the caches with row m's k and v written at slot ``pos_M[m]`` of
    sequence b (in place when the caller's caches can be donated, as in the decode loop)."""
    cfg = config or TuningConfig()
    B, S, G, d = k_BSGd.shape
    H = n_heads
    M, I, N = _check(x_MI, w_NI, None, "norm_qkv_rope", cfg)
    if N != (H + 2 * G) * d or v_BSGd.shape != k_BSGd.shape or M % B:
        raise ValueError(f"norm_qkv_rope: expected w [(H + 2G) d, I] with H={H}, caches [B,S,G,d] equal, "
                         f"M a multiple of B; got w {w_NI.shape}, k {k_BSGd.shape}, v {v_BSGd.shape}, M={M}")
    bn = min(cfg.block_n, d // 2)                          # rotary pairs per program
    if d % (2 * bn) or cos_Md.shape != (M, d) or sin_Md.shape != (M, d) or pos_M.shape != (M,):
        raise ValueError(f"norm_qkv_rope: head dim {d} must be a multiple of 2 * {bn}; cos/sin [M, d] = "
                         f"{(M, d)}, pos [M]; got {cos_Md.shape}, {sin_Md.shape}, {pos_M.shape}")
    bias = b_N is not None
    kern = functools.partial(_qkv_kernel, M=M, T=M // B, I=I, H=H, G=G, d=d, bn=bn, bk=cfg.block_k, eps=eps,
                             bias=bias)
    args = [x_MI, g_I, w_NI] + ([b_N] if bias else []) + [cos_Md.astype(jnp.float32),
                                                          sin_Md.astype(jnp.float32), pos_M.astype(jnp.int32),
                                                          k_BSGd, v_BSGd]
    out = (jax.ShapeDtypeStruct((M, H * d), jnp.float32), jax.ShapeDtypeStruct(k_BSGd.shape, k_BSGd.dtype),
           jax.ShapeDtypeStruct(v_BSGd.shape, v_BSGd.dtype))
    n = len(args)
    return _call(kern, (H + 2 * G, d // (2 * bn)), out, cfg, interpret, "norm_qkv_rope",
                 aliases={n - 2: 1, n - 1: 2})(*args)


# ------------------------------------------------------------------------------------ references
def _inv_rms_reference(x_MI, eps):
    x = x_MI.astype(jnp.float32)
    return lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


def _norm(x_MI, g_I, eps):
    return g_I * (x_MI.astype(jnp.float32) * _inv_rms_reference(x_MI, eps))


def _lin(x_MI, w_NI):
    return jnp.einsum("mi,ni->mn", x_MI.astype(w_NI.dtype), w_NI, preferred_element_type=jnp.float32)


def norm_linear_reference(x_MI, g_I, w_NI, *, eps: float):
    """Pure jnp (not a kernel), the arithmetic of ``specjax.layers`` in compute_dtype "param"."""
    return _lin(_norm(x_MI, g_I, eps), w_NI)


def linear_residual_reference(x_MI, w_NI, r_MN):
    return r_MN.astype(jnp.float32) + _lin(x_MI, w_NI)


def norm_swiglu_reference(x_MI, g_I, w_2FI, *, eps: float):
    gate, up = jnp.split(_lin(_norm(x_MI, g_I, eps), w_2FI), 2, axis=-1)
    return jax.nn.silu(gate) * up


def norm_qkv_rope_reference(x_MI, g_I, w_NI, b_N, cos_Md, sin_Md, pos_M, k_BSGd, v_BSGd, *, n_heads: int,
                            eps: float):
    B, S, G, d = k_BSGd.shape
    M, H = x_MI.shape[0], n_heads
    qkv = _lin(_norm(x_MI, g_I, eps), w_NI)
    if b_N is not None:
        qkv = qkv + b_N
    q, k, v = (a.reshape(M, -1, d) for a in jnp.split(qkv, [H * d, (H + G) * d], axis=-1))

    def rope(a):
        rot = jnp.concatenate([-a[..., d // 2:], a[..., :d // 2]], axis=-1)
        return a * cos_Md[:, None, :] + rot * sin_Md[:, None, :]
    b_M = jnp.arange(M) // (M // B)
    k_BSGd = k_BSGd.at[b_M, pos_M].set(rope(k).astype(k_BSGd.dtype), mode="drop")
    v_BSGd = v_BSGd.at[b_M, pos_M].set(v.astype(v_BSGd.dtype), mode="drop")
    return rope(q).reshape(M, H * d), k_BSGd, v_BSGd


# ------------------------------------------------------------------------------------ benchmark
def _layer_inputs(M, D, F, V, H, G, d, S=512, dtype=jnp.bfloat16):
    ks = iter(jax.random.split(jax.random.key(M + D), 12))
    w = lambda *s: (0.02 * jax.random.normal(next(ks), s, jnp.float32)).astype(dtype)
    x = jax.random.normal(next(ks), (M, D), jnp.float32)
    ang = jax.random.uniform(next(ks), (M, d // 2), jnp.float32, 0, 6.28)
    ang = jnp.concatenate([ang, ang], axis=-1)          # HF rotate-half tables: both halves equal
    cache = lambda: jax.random.normal(next(ks), (1, S, G, d), jnp.float32).astype(dtype)
    return dict(x=x, g=1 + w(D), wqkv=w((H + 2 * G) * d, D), wo=w(D, H * d), wgu=w(2 * F, D), wd=w(D, F),
                head=w(V, D), hq=jax.random.normal(next(ks), (M, H * d)), hf=jax.random.normal(next(ks), (M, F)),
                cos=jnp.cos(ang), sin=jnp.sin(ang), pos=jnp.arange(M, dtype=jnp.int32) + S // 2, k=cache(), v=cache())


def _calls(H, eps=1e-5):
    """name -> (kernel: config -> fn(inputs), XLA reference fn(inputs)); inputs from ``_layer_inputs``."""
    return {
        "norm_qkv_rope": (lambda c: lambda a: norm_qkv_rope(a["x"], a["g"], a["wqkv"], None, a["cos"], a["sin"], a["pos"],
                                                            a["k"], a["v"], n_heads=H, eps=eps, config=c),
                          lambda a: norm_qkv_rope_reference(a["x"], a["g"], a["wqkv"], None, a["cos"], a["sin"], a["pos"],
                                                            a["k"], a["v"], n_heads=H, eps=eps)),
        "o_proj+res": (lambda c: lambda a: linear_residual(a["hq"], a["wo"], a["x"], config=c),
                       lambda a: linear_residual_reference(a["hq"], a["wo"], a["x"])),
        "norm_swiglu": (lambda c: lambda a: norm_swiglu(a["x"], a["g"], a["wgu"], eps=eps, config=c),
                        lambda a: norm_swiglu_reference(a["x"], a["g"], a["wgu"], eps=eps)),
        "down+res": (lambda c: lambda a: linear_residual(a["hf"], a["wd"], a["x"], config=c),
                     lambda a: linear_residual_reference(a["hf"], a["wd"], a["x"])),
        "norm_lm_head": (lambda c: lambda a: norm_linear(a["x"], a["g"], a["head"], eps=eps, config=c),
                         lambda a: norm_linear_reference(a["x"], a["g"], a["head"], eps=eps)),
    }


def main(argv=None) -> None:
    """GPU benchmark (not a kernel): median CUPTI time of each fused kernel against XLA running its
    ``*_reference`` (what the model runs without these kernels), SmolLM2-135M and Llama-3-8B shapes,
    bf16, M = 1 and 8 rows; with ``--tune``, M = 1 also under other tile configs."""
    import argparse
    import numpy as np
    from jax.experimental.mosaic.gpu import profiler
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--tune", action="store_true")
    a = ap.parse_args(argv)

    def us(f, inputs):
        _, ms = profiler.measure(f, iterations=a.iterations)(inputs)
        return 1000 * float(np.median(ms))

    base = TuningConfig()
    alts = [dataclasses.replace(base, **kw) for kw in (dict(block_n=8, num_warps=8), dict(block_n=2, num_warps=2),
                                                      dict(block_n=16), dict(block_k=128), dict(block_k=512),
                                                      dict(num_stages=1), dict(num_stages=5))] if a.tune else []
    shapes = {"smollm2": (576, 1536, 49152, 9, 3, 64), "llama3-8b": (4096, 14336, 128256, 32, 8, 128)}
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}; median of {a.iterations} CUPTI runs, us; "
          f"default {base}")
    print("| model | M | kernel | XLA ref us | kernel us | speedup | max abs err | "
          + " | ".join(f"{c.block_n}/{c.block_k}/w{c.num_warps}/s{c.num_stages}" for c in alts) + " |")
    print("|---|---|---|---|---|---|---|" + "---|" * len(alts))
    for (name, (D, F, V, H, G, d)), M in ((s, m) for s in shapes.items() for m in (1, 8)):
        inp = _layer_inputs(M, D, F, V, H, G, d)
        for kname, (kern, ref) in _calls(H).items():
            t_ref, t_k = us(jax.jit(ref), inp), us(kern(base), inp)
            err = max(float(jnp.max(jnp.abs(o.astype(jnp.float32) - r.astype(jnp.float32))))
                      for o, r in zip(jax.tree.leaves(kern(base)(inp)), jax.tree.leaves(ref(inp))))
            extra = [us(kern(c), inp) for c in alts] if M == 1 else []
            print(f"| {name} | {M} | {kname} | {t_ref:.1f} | {t_k:.1f} | {t_ref / t_k:.2f}x | {err:.1e} | "
                  + " | ".join(f"{t:.1f}" for t in extra) + (" |" if extra else ""), flush=True)


if __name__ == "__main__":
    main()
