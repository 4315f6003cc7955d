"""A whole decoder layer in one launch for one-token decode (B * T = 1), Pallas on the Triton backend.

Why. At B = 1 a small model's decode step is latency-bound, not bandwidth-bound: SmolLM2-135M runs
~9 kernels per layer of 1.5-4 us each (benchmarks/NOTES.md item 13), and every one of them pays a
launch plus a cold round trip to HBM for its first weight bytes. Here one launch does the layer with
``P`` co-resident programs (at most one per SM) that meet at grid-wide barriers between its phases:

  0. RMSNorm -> q|k|v rows (+ bias) -> RoPE; k and v stored into the KV cache in place, q to scratch
  1. attention of the new query over the cache, flash-decoding splits -> partial (acc, max, sum)
  2. merge the splits -> o projection + residual -> h (scratch)
  3. RMSNorm(h) -> gate|up -> SiLU(gate) * up (scratch)
  4. down projection + residual -> the layer's output

A program loads its weight rows for phase i + 1 *before* it waits at the barrier after phase i, so the
weights' HBM latency hides behind the barrier (the weights do not depend on the activations); the
activations a phase reads (a few KB) come from L2. At a barrier each program raises its own flag in
a global array and spins until all flags are raised (``_barrier``); the flags count on from launch
to launch, so one zeroed array serves a whole chain of layers. A grid barrier needs every program resident at once:
``P`` <= the SM count and a small per-program footprint, which ``applies`` checks (small models
only; an 8B layer's rows would not fit a program's registers).

The same kernel body also runs phase by phase, one ``pallas_call`` per phase and no barriers
(``phased=True``): the Pallas interpreter can run that form (it runs programs one after another,
so it cannot run a barrier), and on the GPU the two forms give bitwise the same output (the same
operations on the same tiles), which is how the barriers are tested.

Numerics as ``specjax.model.decoder_layer`` with ``compute_dtype="param"``: residual stream float32,
norm statistics float32, matmul operands rounded to the weight dtype, products and sums float32; q and
the softmax probabilities rounded to the cache dtype before their products (``attention_reference``).
``decode_layer_reference`` is that computation in plain JAX.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

warnings.filterwarnings("ignore", message="The Pallas Triton backend is deprecated", category=DeprecationWarning)

N_PHASES = 5
MAX_TILE = 32768  # largest weight tile (elements) one program holds in registers in a phase


def _pow2(n) -> bool:
    return isinstance(n, int) and n > 0 and n & (n - 1) == 0


@dataclasses.dataclass(frozen=True)
class TuningConfig:
    """Launch parameters. ``num_programs`` must not exceed the SMs of the GPU (a grid barrier needs
    every program resident); ``rows``: weight rows per program, doubled per phase until the phase's
    rows fit one pass of the programs; ``block_keys``: keys per attention step."""
    num_programs: int = 128
    rows: int = 8
    block_keys: int = 64
    num_warps: int = 4
    max_splits: int = 0      # attention splits per kv head (0: as many as the programs allow)

    def __post_init__(self):
        if isinstance(self.num_programs, bool) or not isinstance(self.num_programs, int) or self.num_programs < 1:
            raise ValueError(f"num_programs must be a positive int (<= the GPU's SMs), got {self.num_programs!r}")
        if not (_pow2(self.rows) and 2 <= self.rows <= 64):
            raise ValueError(f"rows must be a power of two in [2, 64], got {self.rows}")
        if not (_pow2(self.block_keys) and 16 <= self.block_keys <= 256):
            raise ValueError(f"block_keys must be a power of two in [16, 256], got {self.block_keys}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps}")
        if isinstance(self.max_splits, bool) or not isinstance(self.max_splits, int) or self.max_splits < 0:
            raise ValueError(f"max_splits must be an int >= 0 (0: no limit), got {self.max_splits!r}")


class _Dims(NamedTuple):
    D: int; H: int; G: int; d: int; F: int; S: int  # noqa: E702
    P: int            # programs
    rq: int; ro: int; rf: int; rd: int  # noqa: E702  rows per program: qkv, o, gate (and up), down
    ck: int; cf: int  # noqa: E702  chunk widths over D and over F
    bk: int           # keys per attention step
    n_splits: int     # attention splits per kv head
    spb: int          # key blocks per split
    eps: float
    scale: float
    bias: bool

    @property
    def R(self):      # query heads per kv head, and that padded to a power of two
        return self.H // self.G

    @property
    def Rp(self):
        return 1 << (self.R - 1).bit_length()

    @property
    def NSp(self):
        return 1 << (self.n_splits - 1).bit_length()


def _chunk(n: int) -> int:
    """Largest power of two <= 256 dividing n (a tile's width must be a power of two)."""
    return math.gcd(n, 256)


def _rows_for(n_rows: int, base: int, P: int, cap: int) -> int:
    """``base`` doubled until the phase's rows fit one pass of the P programs (at most ``cap``)."""
    r, cap = base, min(cap, n_rows & -n_rows)   # a power of two dividing n_rows
    while -(-n_rows // r) > P and 2 * r <= cap:
        r *= 2
    return r


def _dims(D, H, G, d, F, S, eps, scale, bias, cfg: TuningConfig) -> _Dims:
    P = cfg.num_programs
    n_blocks = -(-S // cfg.block_keys)
    n_splits = max(1, min(n_blocks, P // G, cfg.max_splits or n_blocks))
    spb = -(-n_blocks // n_splits)
    n_splits = -(-n_blocks // spb)
    return _Dims(D=D, H=H, G=G, d=d, F=F, S=S, P=P,
                 rq=_rows_for((H + 2 * G) * d, cfg.rows, P, d), ro=_rows_for(D, cfg.rows, P, D),
                 rf=_rows_for(F, cfg.rows, P, F), rd=_rows_for(D, cfg.rows, P, D),
                 ck=_chunk(D), cf=_chunk(F), bk=cfg.block_keys, n_splits=n_splits, spb=spb,
                 eps=eps, scale=scale, bias=bias)


def _fits(z: _Dims) -> str | None:
    """Why these dims cannot run (None if they can)."""
    if z.H % z.G or z.d % 2 or z.rq // 2 > z.d // 2 or (z.d // 2) % (z.rq // 2):
        return f"heads H={z.H}, G={z.G}, d={z.d} with {z.rq} q|k|v rows per program"
    if z.D % z.ro or z.D % z.rd or z.F % z.rf or not _pow2(z.d):
        return f"D={z.D}, F={z.F}, d={z.d} not divisible into row tiles"
    biggest = max(z.rq * z.D, z.ro * z.D, 2 * z.rf * z.D, z.rd * z.F)
    if biggest > MAX_TILE:
        return f"a program's weight tile would hold {biggest} > {MAX_TILE} elements (model too large)"
    return None


# ------------------------------------------------------------------------------------- pieces
def _i(n: int):
    """A static index as an int32 scalar (ref indexers take it in the interpreter and on the GPU)."""
    return jnp.int32(n)


def _f32(x):
    return x.astype(jnp.float32)


def _vec(ref, start, n):
    """ref[start : start + n] as float32. Data other programs wrote is read with plain loads: after
    ``_barrier``'s acquire they see it (no L1 line of it can be stale: nothing read it earlier in the
    launch). (jax 0.11's Triton lowering also rejects the ".cg" cache modifier.)"""
    return _f32(plgpu.load(ref.at[pl.ds(start, n)]))


def _chunks(ref, width, ck):
    return [_vec(ref, c * ck, ck) for c in range(width // ck)]


def _inv_rms(xs, n, eps):
    return lax.rsqrt(sum(jnp.sum(x * x) for x in xs) / n + eps)


def _tile_rows(w_ref, row0, n_rows, width, ck):
    """Weight rows [row0, row0 + n_rows) as a list of [n_rows, ck] chunks (in the weight dtype)."""
    return [w_ref[pl.ds(row0, n_rows), pl.ds(c * ck, ck)] for c in range(width // ck)]


def _dot(tiles, ops):
    """sum over chunks of tile @ op: float32 [rows]."""
    return sum(jnp.sum(_f32(t) * op[None, :], axis=1) for t, op in zip(tiles, ops))


def _operand(xs, wdt):
    return [_f32(x.astype(wdt)) for x in xs]


def _barrier(flags_ref, pid, target, P: int):
    """Grid barrier: every program's stores so far are visible to every program after it returns.
    Each program raises its own flag to ``target`` (an atomic max with release semantics: the same
    value whichever threads execute it), spins on volatile loads until every flag reaches it, then
    makes one acquire access before it loads anything the others wrote."""
    Pp = _next_pow2(P)
    live = lax.broadcasted_iota(jnp.int32, (Pp,), 0) < P
    plgpu.debug_barrier()
    plgpu.atomic_max(flags_ref, (pid,), target)

    def lowest(_):
        return jnp.min(plgpu.load(flags_ref.at[pl.ds(0, Pp)], mask=live, other=target, volatile=True))
    seen = lax.while_loop(lambda v: v < target, lowest, lowest(None))
    # The acquire. Masked by the loop's result, which is what keeps the loop: a loop whose result is
    # unused is dead code to JAX (its loads are only reads), and the barrier would silently vanish.
    plgpu.atomic_add(flags_ref, (pid,), jnp.int32(0), mask=seen >= target)
    plgpu.debug_barrier()


def _next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def flags_size(config: TuningConfig | None = None) -> int:
    """Length of the barrier-flag array ``decode_layer`` takes (int32 zeros at the start of a chain)."""
    return _next_pow2((config or default_config()).num_programs)


# ------------------------------------------------------------------------------------- phases
# Each phase: ``load(r, z, item)`` -> the program's weight tiles (issued before the barrier) and
# ``run(r, z, item, w)``. ``r`` maps buffer names to refs; ``item`` is the program's unit of work.

def _load_qkv(r, z, item):
    half, parts = z.rq // 2, (z.d // 2) // (z.rq // 2)
    hh, j = item // parts, item % parts
    lo, hi = hh * z.d + j * half, hh * z.d + z.d // 2 + j * half
    return _tile_rows(r["wqkv"], lo, half, z.D, z.ck), _tile_rows(r["wqkv"], hi, half, z.D, z.ck)


def _run_qkv(r, z, item, w):
    half, parts = z.rq // 2, (z.d // 2) // (z.rq // 2)
    hh, j = item // parts, item % parts
    c0 = j * half
    xs = _chunks(r["x"], z.D, z.ck)
    inv = _inv_rms(xs, z.D, z.eps)
    gs = _chunks(r["attn_norm"], z.D, z.ck)
    ops = _operand([g * (x * inv) for g, x in zip(gs, xs)], r["wqkv"].dtype)
    a1, a2 = _dot(w[0], ops), _dot(w[1], ops)
    if z.bias:
        a1 = a1 + _vec(r["bqkv"], hh * z.d + c0, half)
        a2 = a2 + _vec(r["bqkv"], hh * z.d + z.d // 2 + c0, half)
    cos, sin = _vec(r["cos"], c0, half), _vec(r["sin"], c0, half)
    r1, r2 = a1 * cos - a2 * sin, a2 * cos + a1 * sin   # HF rotate-half: pairs (c, c + d/2)
    pos = r["pos"][_i(0)]

    @pl.when(hh < z.H)
    def _():
        g, rr = hh // z.R, hh % z.R
        r["q"][g, rr, pl.ds(c0, half)] = r1
        r["q"][g, rr, pl.ds(z.d // 2 + c0, half)] = r2

    for name, first, y1, y2 in (("k", z.H, r1, r2), ("v", z.H + z.G, a1, a2)):
        ref = r[name]

        @pl.when((hh >= first) & (hh < first + z.G))
        def _():
            ref[_i(0), pos, hh - first, pl.ds(c0, half)] = y1.astype(ref.dtype)
            ref[_i(0), pos, hh - first, pl.ds(z.d // 2 + c0, half)] = y2.astype(ref.dtype)


def _run_attention(r, z, item, w):
    """Split ``sp`` of kv head ``g``: key blocks [sp * spb, (sp + 1) * spb) up to the query's position.
    The R query rows of the kv head are a static loop (a [R, keys, d] product would not fit registers)."""
    del w
    g, sp = item // z.n_splits, item % z.n_splits
    kdt = r["k"].dtype
    qs = [_f32(r["q"][g, _i(j), :].astype(kdt)) for j in range(z.R)]
    pos = r["pos"][_i(0)]
    first = sp * z.spb
    stop = jnp.minimum(first + z.spb, pos // z.bk + 1)

    def block(b, carry):
        s_idx = b * z.bk + lax.broadcasted_iota(jnp.int32, (z.bk,), 0)
        kmask = s_idx < z.S
        k = _f32(plgpu.load(r["k"].at[_i(0), pl.ds(b * z.bk, z.bk), g, :], mask=kmask[:, None], other=0.0))
        v = _f32(plgpu.load(r["v"].at[_i(0), pl.ds(b * z.bk, z.bk), g, :], mask=kmask[:, None], other=0.0))
        out = []
        for q, (acc, m, l) in zip(qs, carry):
            s = jnp.where(s_idx <= pos, jnp.sum(k * q[None, :], axis=1) * z.scale, -jnp.inf)   # [bk]
            m_new = jnp.maximum(m, jnp.max(s))
            alpha = jnp.exp(m - m_new)
            p = jnp.exp(s - m_new)
            l = l * alpha + jnp.sum(p)
            p = _f32(p.astype(kdt))
            out.append((acc * alpha + jnp.sum(p[:, None] * v, axis=0), m_new, l))
        return tuple(out)

    init = tuple((jnp.zeros((z.d,), jnp.float32), jnp.float32(-jnp.inf), jnp.float32(0.0)) for _ in range(z.R))
    res = lax.fori_loop(first, jnp.maximum(stop, first), block, init)
    for j, (acc, m, l) in enumerate(res):
        r["po"][g, sp, _i(j), :] = acc
        r["pm"][g, sp, _i(j)] = m
        r["pl"][g, sp, _i(j)] = l


def _merge_head(r, z, hh):
    """Head hh's attention output [d] from its splits' partials (a split that saw no key has
    m = -inf, l = 0 and weighs nothing)."""
    g, rr = _i(hh // z.R), _i(hh % z.R)
    smask = lax.broadcasted_iota(jnp.int32, (z.NSp,), 0) < z.n_splits
    m = plgpu.load(r["pm"].at[g, pl.ds(0, z.NSp), rr], mask=smask, other=-jnp.inf)
    l = plgpu.load(r["pl"].at[g, pl.ds(0, z.NSp), rr], mask=smask, other=0.0)
    acc = plgpu.load(r["po"].at[g, pl.ds(0, z.NSp), rr, :], mask=smask[:, None], other=0.0)
    mx = jnp.max(m)
    wgt = jnp.where(m > -jnp.inf, jnp.exp(m - mx), 0.0)
    return jnp.sum(acc * wgt[:, None], axis=0) / jnp.sum(l * wgt)


def _load_o(r, z, item):
    return _tile_rows(r["wo"], item * z.ro, z.ro, z.H * z.d, z.d)


def _run_o(r, z, item, w):
    ops = _operand([_merge_head(r, z, hh) for hh in range(z.H)], r["wo"].dtype)
    rows = pl.ds(item * z.ro, z.ro)
    r["h"][rows] = _f32(plgpu.load(r["x"].at[rows])) + _dot(w, ops)


def _load_gate_up(r, z, item):
    n0 = item * z.rf
    return _tile_rows(r["w_gate_up"], n0, z.rf, z.D, z.ck), _tile_rows(r["w_gate_up"], z.F + n0, z.rf, z.D, z.ck)


def _run_gate_up(r, z, item, w):
    hs = _chunks(r["h"], z.D, z.ck)
    inv = _inv_rms(hs, z.D, z.eps)
    gs = _chunks(r["mlp_norm"], z.D, z.ck)
    ops = _operand([g * h for g, h in zip(gs, hs)], r["w_gate_up"].dtype)  # 1/rms after (layers.norm_swiglu)
    gate, up = _dot(w[0], ops) * inv, _dot(w[1], ops) * inv
    r["act"][pl.ds(item * z.rf, z.rf)] = gate * (1.0 / (1.0 + jnp.exp(-gate))) * up


def _load_down(r, z, item):
    return _tile_rows(r["w_down"], item * z.rd, z.rd, z.F, z.cf)


def _run_down(r, z, item, w):
    ops = _operand(_chunks(r["act"], z.F, z.cf), r["w_down"].dtype)
    rows = pl.ds(item * z.rd, z.rd)
    r["out"][rows] = _f32(plgpu.load(r["h"].at[rows])) + _dot(w, ops)


def _items(z: _Dims, phase: int) -> int:
    return [(z.H + 2 * z.G) * z.d // z.rq, z.G * z.n_splits, z.D // z.ro, z.F // z.rf, z.D // z.rd][phase]


_LOAD = [_load_qkv, lambda r, z, item: None, _load_o, _load_gate_up, _load_down]
_RUN = [_run_qkv, _run_attention, _run_o, _run_gate_up, _run_down]


# ------------------------------------------------------------------------------------- kernel
IN_NAMES = ("x", "attn_norm", "wqkv", "bqkv", "wo", "mlp_norm", "w_gate_up", "w_down", "cos", "sin", "pos")
STATE_NAMES = ("k", "v", "flags", "out", "q", "po", "pm", "pl", "h", "act")  # written by the kernel


def _layer_kernel(*refs, z: _Dims, names: tuple, phases: tuple, barriers: bool):
    """Phases ``phases`` of the layer for program ``pid`` (the grid is z.P programs). With
    ``barriers`` (one launch for all phases) each next phase's weights are loaded before the grid
    barrier that precedes it."""
    r = dict(zip(names, refs))
    pid = pl.program_id(0)

    def item_of(phase, pass_):
        return pid + pass_ * z.P, pid + pass_ * z.P < _items(z, phase)

    def load_first(phase):
        item, ok = item_of(phase, 0)
        return _LOAD[phase](r, z, jnp.where(ok, item, 0))   # idle programs load item 0's rows, unused

    base = r["flags"][pid] if barriers else None   # every flag ends a launch at the same value
    w_next = load_first(phases[0])
    for i, phase in enumerate(phases):
        w = w_next
        for pass_ in range(-(-_items(z, phase) // z.P)):
            item, ok = item_of(phase, pass_)

            @pl.when(ok)
            def _(item=item, pass_=pass_, w=w, phase=phase):
                _RUN[phase](r, z, item, w if pass_ == 0 else _LOAD[phase](r, z, item))
        if i + 1 < len(phases):
            w_next = load_first(phases[i + 1])   # before the barrier: its latency hides behind the wait
            if barriers:
                _barrier(r["flags"], pid, base + i + 1, z.P)


# ------------------------------------------------------------------------------------- builder
def _state_shapes(z: _Dims, k, v):
    f32 = jnp.float32
    return {"k": k, "v": v, "flags": jax.ShapeDtypeStruct((_next_pow2(z.P),), jnp.int32), "out": jax.ShapeDtypeStruct((z.D,), f32),
            "q": jax.ShapeDtypeStruct((z.G, z.Rp, z.d), f32),
            "po": jax.ShapeDtypeStruct((z.G, z.NSp, z.Rp, z.d), f32),
            "pm": jax.ShapeDtypeStruct((z.G, z.NSp, z.Rp), f32), "pl": jax.ShapeDtypeStruct((z.G, z.NSp, z.Rp), f32),
            "h": jax.ShapeDtypeStruct((z.D,), f32), "act": jax.ShapeDtypeStruct((z.F,), f32)}


def _call(z: _Dims, in_names, state_in, phases, barriers, cfg, interpret):
    """A pallas_call of ``phases``: inputs ``in_names`` then the state buffers ``state_in`` (aliased to
    their outputs: updated in place), outputs every state buffer."""
    shapes = _state_shapes(z, *state_in[:2])
    out_names = STATE_NAMES
    aliases = {len(in_names) + i: out_names.index(n) for i, n in enumerate(STATE_NAMES[:len(state_in)])}
    kernel = functools.partial(_layer_kernel, z=z, names=in_names + STATE_NAMES[:len(state_in)] + out_names,
                               phases=phases, barriers=barriers)
    return pl.pallas_call(
        kernel, grid=(z.P,), out_shape=tuple(jax.ShapeDtypeStruct(shapes[n].shape, shapes[n].dtype) for n in out_names),
        input_output_aliases=aliases, interpret=interpret, name=f"decode_layer_{''.join(map(str, phases))}",
        compiler_params=plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=1))


def default_config() -> TuningConfig:
    """128 programs, or one per SM where the GPU has fewer (a grid barrier needs them all resident)."""
    dev = jax.devices()[0]
    sms = getattr(dev, "core_count", None) if dev.platform == "gpu" else None
    return TuningConfig(num_programs=min(128, sms or 128))


def layer_dims(lp: dict, k_BSGd, n_heads: int, eps: float, config: TuningConfig | None = None) -> _Dims:
    (_, S, G, d), (D,), F = k_BSGd.shape, lp["attn_norm"].shape, lp["w_down"].shape[1]
    return _dims(D, n_heads, G, d, F, S, float(eps), 1.0 / math.sqrt(d), "bqkv" in lp, config or default_config())


def unsupported(lp: dict, x_BTD, k_BSGd, v_BSGd, n_heads: int, eps: float, config=None) -> str | None:
    """Why ``decode_layer`` cannot take this call (None if it can). Static: shapes and dtypes."""
    B, T, D = x_BTD.shape
    if (B, T) != (1, 1):
        return f"one token of one sequence only, got B={B}, T={T}"
    wdt = lp["wqkv"].dtype
    if wdt not in (jnp.bfloat16, jnp.float16, jnp.float32) or any(lp[n].dtype != wdt for n in
                                                                  ("wo", "w_gate_up", "w_down")):
        return f"weights must share one dtype of bf16/fp16/fp32, got {wdt}"
    if k_BSGd.shape != v_BSGd.shape or k_BSGd.shape[0] != 1 or k_BSGd.ndim != 4:
        return f"caches must be [1, S, G, d], got {k_BSGd.shape} and {v_BSGd.shape}"
    z = layer_dims(lp, k_BSGd, n_heads, eps, config)
    if lp["wqkv"].shape != ((n_heads + 2 * z.G) * z.d, D) or lp["w_gate_up"].shape != (2 * z.F, D):
        return f"weight shapes {lp['wqkv'].shape}, {lp['w_gate_up'].shape} do not match D={D}, H={n_heads}"
    return _fits(z)


# ------------------------------------------------------------------------------------- entry
@functools.partial(jax.jit, static_argnames=("n_heads", "eps", "config", "phased", "interpret"))
def decode_layer(lp: dict, x_D, cos_d, sin_d, pos_1, k_BSGd, v_BSGd, flags_P, *, n_heads: int, eps: float,
                 config: TuningConfig | None = None, phased: bool = False, interpret: bool = False):
    """One decoder layer for one new token at position ``pos_1[0]`` of a one-sequence cache.

    x [D] float32 (the residual stream), cos/sin [d] float32 (the position's rotary rows), k/v caches
    [1, S, G, d] (written at slot pos, in place), ``flags_P`` the barrier flags: int32 [flags_size()],
    zeros at the start of a chain of layers, each call's output the next call's input (every flag
    ends a launch at the same value, 4 more than it began; the launch counts from there). ``lp``
    holds the layer's weights as ``specjax.model`` stores them. Returns ``(x_out [D] float32, k, v, flags)``.
    ``phased``: one launch per phase, no barriers (the interpreter's form; bitwise the same output)."""
    cfg = config or default_config()
    z = layer_dims(lp, k_BSGd, n_heads, eps, cfg)
    why = _fits(z)
    if why is not None:
        raise ValueError(f"decode_layer cannot run this layer: {why}")
    if flags_P.shape != (flags_size(cfg),) or flags_P.dtype != jnp.int32:
        raise ValueError(f"flags must be int32 [{flags_size(cfg)}] (flags_size(config)), got {flags_P.dtype} "
                         f"{flags_P.shape}")
    in_names = tuple(n for n in IN_NAMES if n != "bqkv" or z.bias)
    ins = dict(lp, x=x_D.astype(jnp.float32), cos=cos_d.astype(jnp.float32), sin=sin_d.astype(jnp.float32),
               pos=pos_1.astype(jnp.int32))
    args = [ins[n] for n in in_names]
    if not phased:
        st = _call(z, in_names, (k_BSGd, v_BSGd, flags_P), tuple(range(N_PHASES)), True, cfg, interpret)(
            *args, k_BSGd, v_BSGd, flags_P)
    else:
        st = [k_BSGd, v_BSGd, flags_P] + [jnp.zeros(s.shape, s.dtype) for n, s in
                                        _state_shapes(z, k_BSGd, v_BSGd).items() if n not in ("k", "v", "flags")]
        for phase in range(N_PHASES):
            st = _call(z, in_names, tuple(st), (phase,), False, cfg, interpret)(*args, *st)
    named = dict(zip(STATE_NAMES, st))
    return named["out"], named["k"], named["v"], named["flags"]


def decode_layer_reference(lp: dict, x_D, cos_d, sin_d, pos_1, k_BSGd, v_BSGd, *, n_heads: int, eps: float):
    """The same layer in plain JAX (``specjax.model.decoder_layer``'s numerics, compute_dtype="param")."""
    wdt, f32 = lp["wqkv"].dtype, jnp.float32
    _, S, G, d = k_BSGd.shape
    H, pos = n_heads, pos_1[0]
    inv_rms = lambda x: lax.rsqrt(jnp.mean(x * x) + eps)
    mm = lambda x, w: jnp.einsum("i,oi->o", x.astype(wdt), w, preferred_element_type=f32)
    qkv = mm(lp["attn_norm"].astype(f32) * (x_D * inv_rms(x_D)), lp["wqkv"])
    if "bqkv" in lp:
        qkv = qkv + lp["bqkv"].astype(f32)
    qkv = qkv.reshape(H + 2 * G, d)
    rot = jnp.concatenate([-qkv[:, d // 2:], qkv[:, :d // 2]], axis=-1)
    roped = qkv * cos_d + rot * sin_d
    q, k_new, v_new = roped[:H], roped[H:H + G], qkv[H + G:]
    k_BSGd = lax.dynamic_update_slice(k_BSGd, k_new[None, None].astype(k_BSGd.dtype), (0, pos, 0, 0))
    v_BSGd = lax.dynamic_update_slice(v_BSGd, v_new[None, None].astype(v_BSGd.dtype), (0, pos, 0, 0))
    kdt = k_BSGd.dtype
    s = jnp.einsum("grd,sgd->grs", q.astype(kdt).reshape(G, H // G, d), k_BSGd[0], preferred_element_type=f32)
    s = jnp.where(jnp.arange(S) <= pos, s / math.sqrt(d), -jnp.inf)
    p = jax.nn.softmax(s, axis=-1).astype(kdt)
    o = jnp.einsum("grs,sgd->grd", p, v_BSGd[0], preferred_element_type=f32).reshape(H * d)
    h = x_D + mm(o, lp["wo"])
    gate, up = jnp.split(mm(lp["mlp_norm"].astype(f32) * h, lp["w_gate_up"]) * inv_rms(h), 2)
    return h + mm(jax.nn.silu(gate) * up, lp["w_down"]), k_BSGd, v_BSGd


# ------------------------------------------------------------------------------------- benchmark
def main():
    """GPU: time the layer kernel against the reference (XLA) on the SmolLM2-135M shape, B = 1."""
    import argparse
    import time
    ap = argparse.ArgumentParser()
    ap.add_argument("--S", type=int, default=512)
    ap.add_argument("--pos", type=int, default=300)
    ap.add_argument("--iters", type=int, default=200)
    a = ap.parse_args()
    D, H, G, d, F = 576, 9, 3, 64, 1536
    ks = iter(jax.random.split(jax.random.key(0), 12))
    w = lambda *s: (0.05 * jax.random.normal(next(ks), s, jnp.float32)).astype(jnp.bfloat16)
    lp = dict(attn_norm=1 + w(D), wqkv=w((H + 2 * G) * d, D), wo=w(D, H * d), mlp_norm=1 + w(D),
              w_gate_up=w(2 * F, D), w_down=w(D, F))
    x = jax.random.normal(next(ks), (D,))
    ang = a.pos * 0.01 * jnp.arange(d)
    cos, sin, pos = jnp.cos(ang), jnp.sin(ang), jnp.array([a.pos], jnp.int32)
    k, v = (jax.random.normal(next(ks), (1, a.S, G, d)).astype(jnp.bfloat16) for _ in range(2))
    flags = jnp.zeros((flags_size(),), jnp.int32)
    fns = {"kernel": lambda: decode_layer(lp, x, cos, sin, pos, k, v, flags, n_heads=H, eps=1e-5)[0],
           "reference": jax.jit(lambda: decode_layer_reference(lp, x, cos, sin, pos, k, v, n_heads=H, eps=1e-5)[0])}
    for name, f in fns.items():
        f().block_until_ready()
        t0 = time.perf_counter()
        for _ in range(a.iters):
            out = f()
        out.block_until_ready()
        print(f"{name}: {(time.perf_counter() - t0) / a.iters * 1e6:.1f} us per layer call (incl. dispatch)")


if __name__ == "__main__":
    main()
