"""FlashAttention-3 forward for Hopper (sm90) in Pallas Mosaic GPU, with a custom_vjp backward.

One CTA owns ``2 * block_q`` query rows of one (batch, head). Three warpgroups:
  * wg 2, the producer: registers lowered with ``setmaxnreg`` to 40, issues TMA loads of K/V blocks
    into a ring of ``num_stages`` SMEM slots (``k_ready``/``v_ready`` barriers) and refills a slot
    once both consumers released it (``k_free``/``v_free``).
  * wg 0 and wg 1, the consumers (registers raised to 232), ``block_q`` rows each, in ping-pong: a
    shared two-arrival ``schedule`` barrier lets one warpgroup's QK^T / PV wgmma run while the other
    does its online softmax (exp2, scale folded into one FMA), so the tensor cores stay busy.
    QK^T is wgmma SMEM x SMEM; PV is wgmma with P in registers (A operand) into the running acc.

Masking is one rule: key ``s`` is visible to query row ``t`` of batch ``b`` iff ``s < k_end[b, t]``
(see ``key_end``). It expresses non-causal, causal top-left, causal bottom-right (KV-cache offsets),
per-sequence lengths and the model's ``s <= q_pos`` rule. Per CTA the kernel reads the min / max
of ``k_end`` over its rows: KV blocks past ``cdiv(max, block_kv)`` are never loaded, blocks below
``min // block_kv`` run unmasked, only the rest pay for the mask. Sequence tails need no
divisibility: TMA zero-fills out-of-bounds loads and drops out-of-bounds stores. Rows that see no key
return 0 and ``lse = -inf``.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
from jax import lax

_WGMMA = plgpu.Layout.WGMMA
_ROW = plgpu.Layout.WGMMA.reduce(1)
_LOG2E = math.log2(math.e)
_LN2 = math.log(2.0)
_MASKED = -1e30  # finite: a row that has seen only masked keys still has a finite running max


@dataclasses.dataclass(frozen=True)
class TuningConfig:
    """Block sizes of the forward kernel. ``interpretable`` swaps PV's register A-operand and
    accumulator-init wgmma for SMEM x SMEM + add, which the Mosaic GPU interpreter can run."""
    block_q: int = 64        # query rows per consumer warpgroup (a CTA owns 2 * block_q)
    block_kv: int = 128      # keys per pipeline step
    num_stages: int = 2      # K/V SMEM ring depth
    interpretable: bool = False

    def __post_init__(self):
        if self.block_q != 64:
            raise ValueError(f"block_q must be 64 (one wgmma M tile per warpgroup), got {self.block_q}")
        if self.block_kv % 64 or not 64 <= self.block_kv <= 256:
            raise ValueError(f"block_kv must be 64, 128, 192 or 256, got {self.block_kv}")
        if self.num_stages < 2:
            raise ValueError(f"num_stages must be >= 2 (double buffering), got {self.num_stages}")

    def smem_bytes(self, head_dim: int, itemsize: int = 2) -> int:
        q = 2 * self.block_q * head_dim * itemsize
        kv = 2 * self.num_stages * self.block_kv * head_dim * itemsize
        p = 2 * self.block_q * self.block_kv * itemsize if self.interpretable else 0
        return q + kv + p + 2 * self.block_q * 4


def default_config(head_dim: int) -> TuningConfig:
    """Largest KV block that fits 227 KiB of SMEM with a 2-deep ring (attention_mgpu's choice; not tuned)."""
    return TuningConfig(block_kv={64: 256, 128: 128, 256: 64}.get(head_dim, 64))


def _kernel(q_ref, k_ref, v_ref, kend_ref, kmin_ref, kmax_ref, o_ref, lse_ref, scoped, *,
            cfg: TuningConfig, n_rep: int, scale_log2: float, n_kv_blocks: int, n_tiles: int):
    bq, bkv, stages = cfg.block_q, cfg.block_kv, cfg.num_stages
    (q_smem2, k_smem, v_smem, lse_smem2, p_smem2), (k_ready, v_ready, q_ready), \
        (k_free, v_free), schedule = scoped
    hi, bi, wg = (lax.axis_index(n) for n in ("heads", "batch", "wg"))
    qi = n_tiles - 1 - lax.axis_index("q_tiles")  # longest (causal) tiles first
    kmax, kmin = kmax_ref[bi, qi], kmin_ref[bi, qi]
    n_steps = jnp.minimum(pl.cdiv(kmax, bkv), n_kv_blocks)   # KV blocks any row of this CTA sees
    n_open = jnp.minimum(lax.div(kmin, bkv), n_steps)        # blocks every row sees entirely

    def schedule_sync():
        plgpu.barrier_arrive(schedule)
        plgpu.barrier_wait(schedule)

    @pl.when(wg < 2)
    def _consumer():
        plgpu.set_max_registers(232, action="increase")
        q_smem, lse_smem = q_smem2.at[wg], lse_smem2.at[wg]
        q_base = (2 * qi + wg) * bq
        plgpu.copy_gmem_to_smem(q_ref.at[bi, pl.ds(q_base, bq), hi], q_smem, q_ready.at[wg])
        kend_row = plgpu.load(kend_ref.at[bi, pl.ds(q_base, bq)], layout=_ROW, optimized=False)
        m_i = plgpu.layout_cast(jnp.full((bq,), -jnp.inf, jnp.float32), _ROW)
        l_i = plgpu.layout_cast(jnp.zeros((bq,), jnp.float32), _ROW)
        acc = plgpu.layout_cast(jnp.zeros((bq, q_smem.shape[-1]), jnp.float32), _WGMMA)
        plgpu.barrier_wait(q_ready.at[wg])

        @pl.when(n_steps > 0)
        def _():
            plgpu.barrier_wait(k_ready.at[0])

        pl.when(wg == 1)(schedule_sync)  # wg 1 starts half a step behind wg 0: ping-pong

        def step(ki, carry, masked: bool):
            acc, m_i, l_i = carry
            slot = lax.rem(ki, stages)

            def qk(acc_ref):
                plgpu.wgmma(acc_ref, q_smem, k_smem.at[slot].T)
                schedule_sync()          # let the other warpgroup issue its wgmma
                return acc_ref[...]
            s = pl.run_scoped(qk, plgpu.ACC((bq, bkv), jnp.float32))
            plgpu.barrier_arrive(k_free.at[slot])
            if masked:
                col = plgpu.broadcasted_iota(jnp.int32, (bq, bkv), 1, layout=_WGMMA) + ki * bkv
                s = jnp.where(col < lax.broadcast_in_dim(kend_row, (bq, bkv), [0]), s, _MASKED)
            # m is kept in the scaled log2 domain, so p = exp2(s * c - m) is one FMA per element.
            m_new = jnp.maximum(m_i, s.max(axis=1) * scale_log2)
            alpha = jnp.exp2(m_i - m_new)
            p = jnp.exp2(s * scale_log2 - lax.broadcast_in_dim(m_new, s.shape, [0]))
            l_i = l_i * alpha + p.sum(axis=1)
            acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
            p_lo = p.astype(k_smem.dtype)
            acc, l_i, m_new, p_lo = lax.optimization_barrier((acc, l_i, m_new, p_lo))
            plgpu.barrier_arrive(schedule)     # softmax done: our PV may go after the other's QK
            plgpu.barrier_wait(v_ready.at[slot])
            plgpu.barrier_wait(schedule)

            def wait_next_k():
                @pl.when(ki + 1 < n_steps)
                def _():
                    plgpu.barrier_wait(k_ready.at[lax.rem(ki + 1, stages)])

            if cfg.interpretable:
                p_smem = p_smem2.at[wg]
                p_smem[...] = p_lo
                plgpu.commit_smem()

                def pv(acc_ref):
                    plgpu.wgmma(acc_ref, p_smem, v_smem.at[slot])
                    wait_next_k()
                    return acc_ref[...]
                acc = acc + pl.run_scoped(pv, plgpu.ACC(acc.shape, jnp.float32))
            else:
                def pv(acc_ref):
                    plgpu.wgmma(acc_ref, p_lo, v_smem.at[slot])
                    wait_next_k()
                acc = pl.run_state(pv)(plgpu.ACC.init(acc))
            plgpu.barrier_arrive(v_free.at[slot])
            return acc, m_new, l_i

        carry = lax.fori_loop(0, n_open, functools.partial(step, masked=False), (acc, m_i, l_i))
        acc, m_i, l_i = lax.fori_loop(n_open, n_steps, functools.partial(step, masked=True), carry)
        pl.when(wg == 0)(schedule_sync)

        seen = kend_row > 0
        inv_l = jnp.where(seen, 1.0 / jnp.where(seen, l_i, 1.0), 0.0)
        q_smem[...] = (acc * lax.broadcast_in_dim(inv_l, acc.shape, [0])).astype(q_smem.dtype)
        lse_smem[...] = jnp.where(seen, m_i * _LN2 + jnp.log(jnp.where(seen, l_i, 1.0)), -jnp.inf)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(q_smem, o_ref.at[bi, pl.ds(q_base, bq), hi])
        plgpu.copy_smem_to_gmem(lse_smem, lse_ref.at[bi, hi, pl.ds(q_base, bq)])
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

    @pl.when(wg == 2)
    def _producer():
        plgpu.set_max_registers(40, action="decrease")
        gi = lax.div(hi, n_rep)

        def load(ki, slot):
            kv = (bi, pl.ds(ki * bkv, bkv), gi)
            plgpu.copy_gmem_to_smem(k_ref.at[kv], k_smem.at[slot], k_ready.at[slot])
            plgpu.copy_gmem_to_smem(v_ref.at[kv], v_smem.at[slot], v_ready.at[slot])

        for i in range(stages):
            pl.when(i < n_steps)(functools.partial(load, i, i))

        @pl.loop(0, jnp.maximum(n_steps - stages, 0))
        def _(ki):
            slot = lax.rem(ki, stages)
            plgpu.barrier_wait(k_free.at[slot])
            kv = (bi, pl.ds((ki + stages) * bkv, bkv), gi)
            plgpu.copy_gmem_to_smem(k_ref.at[kv], k_smem.at[slot], k_ready.at[slot])
            plgpu.barrier_wait(v_free.at[slot])
            plgpu.copy_gmem_to_smem(v_ref.at[kv], v_smem.at[slot], v_ready.at[slot])

        @pl.loop(jnp.maximum(n_steps - stages, 0), n_steps)
        def _(ki):  # observe the last releases too, so no barrier phase is left pending at exit
            plgpu.barrier_wait(k_free.at[lax.rem(ki, stages)])
            plgpu.barrier_wait(v_free.at[lax.rem(ki, stages)])


def _smem_tiled(shape, dtype):
    swizzle = plgpu.find_swizzle(shape[-1] * jnp.dtype(dtype).itemsize * 8)
    tiling = plgpu.TilingTransform((8, swizzle // jnp.dtype(dtype).itemsize))
    return plgpu.SMEM(shape, dtype, transforms=(tiling, plgpu.SwizzleTransform(swizzle)))


def _build_forward(B: int, T: int, H: int, S: int, G: int, d: int, dtype, cfg: TuningConfig,
                   scale: float):
    """Returns ``fwd(q, k, v, kend_BTp, kmin_BN, kmax_BN) -> (o_BTHd, lse_BHTp)``."""
    n_tiles = pl.cdiv(T, 2 * cfg.block_q)
    stages = cfg.num_stages
    body = functools.partial(_kernel, cfg=cfg, n_rep=H // G, scale_log2=scale * _LOG2E,
                             n_kv_blocks=pl.cdiv(S, cfg.block_kv), n_tiles=n_tiles)

    def entry(*refs):
        scratch = (
            _smem_tiled((2, cfg.block_q, d), dtype),
            _smem_tiled((stages, cfg.block_kv, d), dtype),
            _smem_tiled((stages, cfg.block_kv, d), dtype),
            plgpu.SMEM((2, cfg.block_q), jnp.float32),
            _smem_tiled((2, cfg.block_q, cfg.block_kv), dtype) if cfg.interpretable else None,
        )
        barriers = (plgpu.Barrier(num_barriers=stages), plgpu.Barrier(num_barriers=stages),
                    plgpu.Barrier(num_barriers=2))
        free = (plgpu.Barrier(num_arrivals=2, num_barriers=stages),) * 2
        pl.run_scoped(lambda *s: body(*refs, s), scratch, barriers, free,
                      plgpu.Barrier(num_arrivals=2), collective_axes="wg")

    return plgpu.kernel(
        entry,
        out_type=(jax.ShapeDtypeStruct((B, T, H, d), dtype),
                  jax.ShapeDtypeStruct((B, H, n_tiles * 2 * cfg.block_q), jnp.float32)),
        grid=(H, B, n_tiles), grid_names=("heads", "batch", "q_tiles"),
        num_threads=3, thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True))


def key_end(B: int, T: int, S: int, *, causal: str = "none", kv_lens_B=None, q_lens_B=None,
            q_pos_BT=None) -> jax.Array:
    """``k_end[b, t]``: query row t of sequence b sees key slots ``s < k_end[b, t]``.

    causal: "none"; "top_left" (prefill: row t sees keys <= t); "bottom_right" (the T queries are
    the last of ``kv_lens`` keys, as when appending to a KV cache); "positions" (row t sees keys
    ``<= q_pos_BT[b, t]``, the model's rule). ``kv_lens_B`` (default S) caps every row; rows at or
    past ``q_lens_B`` (default T) are padding and see nothing.
    """
    kv = jnp.full((B,), S, jnp.int32) if kv_lens_B is None else jnp.asarray(kv_lens_B, jnp.int32)
    ql = jnp.full((B,), T, jnp.int32) if q_lens_B is None else jnp.asarray(q_lens_B, jnp.int32)
    t = jnp.arange(T, dtype=jnp.int32)[None, :]
    end = {"none": lambda: jnp.broadcast_to(kv[:, None], (B, T)),
           "top_left": lambda: t + 1,
           "bottom_right": lambda: kv[:, None] - ql[:, None] + t + 1,
           "positions": lambda: jnp.asarray(q_pos_BT, jnp.int32) + 1}
    if causal not in end or (causal == "positions") != (q_pos_BT is not None):
        raise ValueError(f"causal must be one of {sorted(end)} (q_pos_BT given iff 'positions'), "
                         f"got causal={causal!r}, q_pos_BT given: {q_pos_BT is not None}")
    end_BT = jnp.clip(jnp.minimum(end[causal](), kv[:, None]), 0, S)
    return jnp.where(t < ql[:, None], end_BT, 0).astype(jnp.int32)


def _check(q, k, v, kend):
    (B, T, H, d), (Bk, _, G, dk) = q.shape, k.shape
    if k.shape != v.shape or (Bk, dk) != (B, d) or H % G or kend.shape != (B, T):
        raise ValueError(f"expected q [B,T,H,d], k = v [B,S,G,d] with H % G == 0, k_end [B,T]; got "
                         f"q {q.shape}, k {k.shape}, v {v.shape}, k_end {kend.shape}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (jnp.bfloat16, jnp.float16):
        raise ValueError(f"q, k, v must share dtype bfloat16 or float16, got {q.dtype}, {k.dtype}, {v.dtype}")
    if d not in (64, 128, 256):
        raise ValueError(f"head dim must be 64, 128 or 256, got {d}")


@functools.partial(jax.jit, static_argnames=("scale", "config"))
def flash_attention_fwd(q_BTHd, k_BSGd, v_BSGd, kend_BT, *, scale: float | None = None,
                        config: TuningConfig | None = None):
    """Jitted entry: ``(o [B,T,H,d], lse [B,H,T] natural log, float32)``."""
    _check(q_BTHd, k_BSGd, v_BSGd, kend_BT)
    (B, T, H, d), (S, G) = q_BTHd.shape, k_BSGd.shape[1:3]
    cfg = config or default_config(d)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    rows = 2 * cfg.block_q
    n_tiles = pl.cdiv(T, rows)
    # TMA needs sequence dims that are multiples of its 8-row tiles and at least one box long:
    # only lengths breaking that are padded (a copy); other tails are zero-filled by TMA itself.
    up8 = lambda n: -(-n // 8) * 8
    Tq, Sk = max(up8(T), rows), max(up8(S), cfg.block_kv * cfg.num_stages)
    q = jnp.pad(q_BTHd, ((0, 0), (0, Tq - T), (0, 0), (0, 0))) if Tq > T else q_BTHd
    pad_kv = lambda x: jnp.pad(x, ((0, 0), (0, Sk - S), (0, 0), (0, 0))) if Sk > S else x
    kend = jnp.pad(jnp.clip(kend_BT.astype(jnp.int32), 0, S), ((0, 0), (0, n_tiles * rows - T)))
    tiles = kend.reshape(B, n_tiles, rows)
    real = (jnp.arange(n_tiles * rows) < T).reshape(1, n_tiles, rows)
    kmin, kmax = jnp.where(real, tiles, S).min(-1), tiles.max(-1)
    fwd = _build_forward(B, Tq, H, Sk, G, d, q.dtype, cfg, scale)
    o, lse = fwd(q, pad_kv(k_BSGd), pad_kv(v_BSGd), kend, kmin, kmax)
    return o[:, :T], lse[:, :, :T]


def flash_attention_reference(q_BTHd, k_BSGd, v_BSGd, kend_BT, *, scale: float | None = None):
    """Pure JAX, float32 softmax: ``(o [B,T,H,d] in q's dtype, lse [B,H,T] float32)``."""
    (B, T, H, d), (S, G) = q_BTHd.shape, k_BSGd.shape[1:3]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q = q_BTHd.astype(jnp.float32).reshape(B, T, G, H // G, d)
    s = jnp.einsum("btgrd,bsgd->bgrts", q, k_BSGd.astype(jnp.float32)) * scale
    mask = (jnp.arange(S)[None, None, :] < kend_BT[:, :, None])[:, None, None]
    s = jnp.where(mask, s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.exp(s - m)
    l = e.sum(-1, keepdims=True)
    p = e / jnp.where(l > 0, l, 1.0)
    o = jnp.einsum("bgrts,bsgd->btgrd", p, v_BSGd.astype(jnp.float32)).reshape(B, T, H, d)
    lse = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), -jnp.inf)[..., 0]
    return o.astype(q_BTHd.dtype), lse.reshape(B, H, T)


def main(argv=None) -> None:
    """Time one FA3-paper shape (16k tokens, H*d = 2048) or, with --small, run one tiny checked
    call (what ``compute-sanitizer --tool racecheck`` is pointed at)."""
    import argparse
    import numpy as np
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    a = ap.parse_args(argv)
    B, S, d = (1, 300, 64) if a.small else (16384 // a.seq, a.seq, a.head_dim)
    H = 2 if a.small else 2048 // d
    q, k, v = (jax.random.normal(kk, (B, S, H, d), jnp.bfloat16)
               for kk in jax.random.split(jax.random.key(0), 3))
    kend = key_end(B, S, S, causal="top_left" if a.causal else "none")
    o, lse = flash_attention_fwd(q, k, v, kend)
    ref = flash_attention_reference(*(x.astype(jnp.float32) for x in (q, k, v)), kend)[0]
    err = float(jnp.linalg.norm(o.astype(jnp.float32) - ref) / jnp.linalg.norm(ref))
    print(f"B={B} S={S} H={H} d={d} causal={a.causal}: relative error {err:.2e}")
    if not a.small:
        from jax.experimental.mosaic.gpu import profiler
        _, ms = profiler.measure(lambda *x: flash_attention_fwd(*x), iterations=20)(q, k, v, kend)
        flops = 4 * B * S * S * H * d / (2 if a.causal else 1)
        print(f"median {np.median(ms):.3f} ms = {flops / np.median(ms) / 1e9:.0f} TFLOPS")


if __name__ == "__main__":
    main()
