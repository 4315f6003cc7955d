"""Orbax checkpoints of the train state plus the data position, for exact resumption.

A checkpoint holds ``state`` (step, float32 master params, optimizer state) and ``data`` (a JSON
record: the data position — the number of batches consumed — and the data seed). Saves are
synchronous and atomic (Orbax writes a temp folder and renames it), so a run killed mid-save
resumes from the previous complete checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
import orbax.checkpoint as ocp

from specjax.errors import CheckpointError


class Checkpointer:
    def __init__(self, directory: str | os.PathLike, max_to_keep: int = 2):
        self.directory = Path(directory).expanduser().absolute()
        self.manager = ocp.CheckpointManager(
            self.directory, options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep, enable_async_checkpointing=False, create=True))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, data: dict) -> None:
        self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                        data=ocp.args.JsonSave(data)), force=True)
        self.manager.wait_until_finished()

    def restore(self, like_state, step: int | None = None):
        """``(state, data)`` of ``step`` (default: latest), shaped like ``like_state``."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like_state)
        try:
            out = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                                     data=ocp.args.JsonRestore()))
        except Exception as e:  # orbax raises assorted errors on structure/shape mismatch
            raise CheckpointError(f"cannot restore step {step} from {self.directory}: the checkpoint does not "
                                  f"match this run's parameters/optimizer ({type(e).__name__}: {e})") from e
        return out["state"], dict(out["data"])

    def close(self) -> None:
        self.manager.close()
