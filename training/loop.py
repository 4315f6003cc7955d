"""The generic training loop: a jitted step with donated state, Optax AdamW (warmup + cosine,
global-norm clipping), float32 master weights with bf16 (or fp32) compute, Orbax checkpoints with
the data position, and a tqdm bar showing the loss and the acceptance proxy per offset. Data
parallel over the local devices (``TrainConfig.devices``): the state and the frozen tensors are
replicated, each batch is split along its rows, and XLA's SPMD partitioner inserts the gradient
all-reduce (the loss is the global batch's, so the trajectory is the one-device one up to the
order of float additions).

``loss_fn(params, frozen, batch) -> (loss, {"loss_k": [K], "acc_k": [K]})`` receives the params cast
to the compute dtype; gradients flow back through the cast into the float32 masters. A run with a
checkpoint folder resumes from its latest checkpoint and then follows the identical trajectory.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from training.checkpoint import Checkpointer
from training.data import TokenDataset
from training.pool import first_devices


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 100
    batch_size: int = 8
    lr: float = 1e-3
    warmup_steps: int = 10
    end_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    clip_norm: float = 1.0
    compute_dtype: str = "float32"  # "bfloat16" on GPU
    seed: int = 0  # data order
    ckpt_dir: str | None = None
    ckpt_every: int = 100
    log_every: int = 1  # steps between host reads of the metrics (the bar and history update then)
    max_seconds: float | None = None  # wall-clock cap: stop early (with a checkpoint) once exceeded
    progress: bool = True
    devices: int | None = None  # data-parallel devices: the first n of jax.devices() (None: all)

    def __post_init__(self):
        if self.steps <= 0 or self.batch_size <= 0 or self.lr <= 0:
            raise ValueError(f"steps, batch_size and lr must be positive, got {self.steps}, {self.batch_size}, "
                             f"{self.lr}")
        if self.devices is not None and (isinstance(self.devices, bool) or not isinstance(self.devices, int)
                                         or self.devices < 1):
            raise ValueError(f"devices must be a positive int or None (all local devices), got {self.devices!r}")
        if self.compute_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"compute_dtype must be 'float32' or 'bfloat16', got {self.compute_dtype!r}")


@dataclasses.dataclass(frozen=True)
class TrainResult:
    params: dict  # float32 master weights
    history: list[dict]  # one record per step run in this call: step, loss, loss_k, acc_k
    start_step: int  # the step this call started from (> 0 when resumed)
    end_step: int  # the step reached (< steps when stopped by stop_after or max_seconds)
    heldout: dict | None = None  # ``evaluate`` on the held-out rows at end_step, when given


def make_optimizer(tc: TrainConfig) -> optax.GradientTransformation:
    sched = optax.warmup_cosine_decay_schedule(0.0, tc.lr, min(tc.warmup_steps, tc.steps - 1),
                                               max(tc.steps, tc.warmup_steps + 1), tc.lr * tc.end_lr_ratio)
    return optax.chain(optax.clip_by_global_norm(tc.clip_norm),
                       optax.adamw(sched, b1=0.9, b2=0.95, weight_decay=tc.weight_decay))


def _on_cast_params(loss_fn: Callable, compute_dtype) -> Callable:
    """``loss_fn`` applied to the params cast to the compute dtype (gradients flow back to the masters)."""
    return lambda p, frozen, batch: loss_fn(jax.tree.map(lambda x: x.astype(compute_dtype), p), frozen, batch)


def data_mesh(tc: TrainConfig) -> jax.sharding.Mesh:
    """A 1-D ``("data",)`` mesh over ``tc.devices`` devices (default: all) that a batch's rows split over."""
    devices = first_devices(tc.devices, "data parallelism (TrainConfig.devices)")
    if tc.batch_size % len(devices):
        raise ValueError(f"data parallelism over {len(devices)} devices needs a batch size divisible by "
                         f"{len(devices)} (got {tc.batch_size}); set TrainConfig.devices")
    return jax.sharding.Mesh(np.asarray(devices), ("data",))


def make_step(loss_fn: Callable, opt: optax.GradientTransformation, compute_dtype,
              mesh: jax.sharding.Mesh) -> Callable:
    """The jitted, state-donating update; its state and metrics stay replicated on ``mesh``."""
    cast_loss = _on_cast_params(loss_fn, compute_dtype)

    def step(state, frozen, batch):
        f = lambda p: cast_loss(p, frozen, batch)
        (loss, metrics), grads = jax.value_and_grad(f, has_aux=True)(state["params"])
        updates, opt_state = opt.update(grads, state["opt_state"], state["params"])
        new = {"step": state["step"] + 1, "params": optax.apply_updates(state["params"], updates),
               "opt_state": opt_state}
        return new, loss, metrics
    return jax.jit(step, donate_argnums=0, out_shardings=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))


def evaluate(loss_fn: Callable, params: dict, frozen, data: TokenDataset, batch_size: int, compute_dtype) -> dict:
    """``loss_fn``'s loss, loss_k and acc_k on ``data`` without an update, averaged over its batches of
    ``batch_size`` consecutive rows (a last partial batch is dropped; fewer rows make one batch): how a
    run does on rows it never trained on, next to the training bar's figures."""
    f = jax.jit(_on_cast_params(loss_fn, compute_dtype))
    bs = min(batch_size, len(data))
    recs = []
    for a in range(0, len(data) - bs + 1, bs):
        loss, m = f(params, frozen, {k: jnp.asarray(v) for k, v in data.take(slice(a, a + bs)).items()})
        recs.append((float(loss), np.asarray(m["loss_k"]), np.asarray(m["acc_k"])))
    mean = lambda i: np.mean([r[i] for r in recs], axis=0)
    return {"rows": len(recs) * bs, "loss": float(mean(0)), "loss_k": mean(1).tolist(), "acc_k": mean(2).tolist()}


def _postfix(loss: float, acc_k: np.ndarray) -> dict:
    return {"loss": f"{loss:.3f}", "acc": " ".join(f"{a:.2f}" for a in acc_k)}


def train(loss_fn: Callable, params: dict, frozen, data: TokenDataset, tc: TrainConfig, *,
          stop_after: int | None = None, callback: Callable[[dict], None] | None = None,
          desc: str = "train", heldout: TokenDataset | None = None) -> TrainResult:
    """Run ``tc.steps`` steps, resuming from the latest checkpoint in ``tc.ckpt_dir`` if there is one.

    ``stop_after`` ends this call after that global step without a final checkpoint (as a crash
    would); ``callback`` gets each history record as the metrics reach the host; ``heldout`` rows
    are scored with ``evaluate`` at the end (``TrainResult.heldout``)."""
    opt = make_optimizer(tc)
    mesh = data_mesh(tc)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    params = jax.tree.map(lambda x: jnp.array(x, jnp.float32, copy=True), params)  # own buffers: the state is donated
    state = jax.device_put({"step": jnp.int32(0), "params": params, "opt_state": opt.init(params)}, replicated)
    frozen = jax.device_put(frozen, replicated)
    ckpt = Checkpointer(tc.ckpt_dir) if tc.ckpt_dir else None
    if ckpt is not None and ckpt.latest_step() is not None:
        state, meta = ckpt.restore(state)
        if meta.get("data_seed") != tc.seed or meta.get("batch_size") != tc.batch_size:
            raise ValueError(f"checkpoint in {tc.ckpt_dir} was written with data seed {meta.get('data_seed')} and "
                             f"batch size {meta.get('batch_size')}; this run uses {tc.seed} and {tc.batch_size}")
    start = int(state["step"])
    step_fn = make_step(loss_fn, opt, jnp.dtype(tc.compute_dtype), mesh)
    end = tc.steps if stop_after is None else min(tc.steps, stop_after)
    history, pending, t0 = [], [], time.perf_counter()
    bar = tqdm(range(start, end), desc=desc, disable=not tc.progress, initial=start, total=tc.steps)

    def flush():  # device -> host, once per log_every steps
        recs = [{"step": s, "loss": float(l), "loss_k": np.asarray(m["loss_k"]).tolist(),
                 "acc_k": np.asarray(m["acc_k"]).tolist()} for s, l, m in pending]
        pending.clear()
        history.extend(recs)
        for rec in recs if callback is not None else ():
            callback(rec)
        if recs:
            bar.set_postfix(_postfix(recs[-1]["loss"], recs[-1]["acc_k"]), refresh=False)

    try:
        for i in bar:
            batch = jax.device_put(data.batch(i, tc.batch_size, tc.seed), rows)
            state, loss, metrics = step_fn(state, frozen, batch)
            pending.append((i + 1, loss, metrics))
            out_of_time = tc.max_seconds is not None and time.perf_counter() - t0 > tc.max_seconds
            if (i + 1) % tc.log_every == 0 or i + 1 == end or out_of_time:
                flush()
            if ckpt is not None and ((i + 1) % tc.ckpt_every == 0 or i + 1 == tc.steps or out_of_time):
                ckpt.save(i + 1, state, {"data_position": i + 1, "data_seed": tc.seed, "batch_size": tc.batch_size})
            if out_of_time:
                break
    finally:
        bar.close()
        if ckpt is not None:
            ckpt.close()
    held = None if heldout is None else evaluate(loss_fn, state["params"], frozen, heldout, tc.batch_size,
                                                 jnp.dtype(tc.compute_dtype))
    return TrainResult(params=state["params"], history=history, start_step=start, end_step=int(state["step"]),
                       heldout=held)
