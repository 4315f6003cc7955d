"""Probe (CPU): how far the decode kernel's tree levels and the reference attention each are from the float32
forward, for the draft model of ``tests/test_tree.py::test_gpu_draft_model_tree_levels_kernel_vs_reference``
(benchmarks/NOTES.md item 48). The kernel runs in the Pallas interpreter, reached through the model's own
dispatch (``interpreted_kernel``); the reference is ``SPECJAX_ATTENTION=reference``'s path; the float32
forward has float32 matmul operands (no kernel applies). Prints relative logit distances (Frobenius norm).

    PJRT_NPROC=8 PYTHONPATH=.:tests python3 benchmarks/tree_levels_probe.py [--batch 1,2] [--wrong-bits]

``--wrong-bits``: a broken kernel, each tree row's mask bits shifted by one slot (every node sees its neighbour's
slots instead of its ancestors'), to show what the test's bound (kernel within 1.25x the reference's distance from
float32) does with a real masking error.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
from unittest import mock

import numpy as np

from pallas_kernels import decode_attention, dispatch
from specjax import attention
from test_tree import LEVELS_TREE, tree_level_logits, tree_levels_case


@contextlib.contextmanager
def interpreted_kernel(wrong_bits: bool):
    """The model's own kernel dispatch (``pallas_kernels.dispatch``) as on Hopper, its decode kernel in the Pallas
    interpreter; prefill (> 32 rows, FA3's on a GPU) takes the reference attention. ``wrong_bits``: every tree row's
    mask bits shifted by one slot."""
    with contextlib.ExitStack() as stack:
        patch = lambda obj, name, value: stack.enter_context(mock.patch.object(obj, name, value))
        patch(attention, "_use_kernels", lambda: True)
        patch(dispatch, "_gpu_backend", lambda: True)
        patch(dispatch, "attend", lambda *a, **k: None)
        patch(dispatch, "rope_attention_write", functools.partial(decode_attention.rope_attention_write,
                                                                  interpret=True))
        if wrong_bits:
            tree_bits = dispatch.tree_bits
            patch(dispatch, "tree_bits", lambda visible_TW: tree_bits(visible_TW) << 1)
        yield


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="1,2")
    ap.add_argument("--wrong-bits", action="store_true")
    args = ap.parse_args()
    rel = lambda a, b: float(np.linalg.norm(a - b) / np.linalg.norm(b))
    for B in [int(b) for b in args.batch.split(",")]:
        cfg, params, prompts = tree_levels_case(B)
        ref = tree_level_logits(params, cfg, prompts, LEVELS_TREE)
        exact = tree_level_logits(params, dataclasses.replace(cfg, compute_dtype="float32"), prompts, LEVELS_TREE)
        with interpreted_kernel(args.wrong_bits):
            got = tree_level_logits(params, cfg, prompts, LEVELS_TREE)
        print(f"B={B}: kernel vs reference {rel(got, ref):.4f}; kernel vs float32 {rel(got, exact):.4f}; "
              f"reference vs float32 {rel(ref, exact):.4f}; kernel vs reference per row "
              f"{[round(rel(got[:, i], ref[:, i]), 4) for i in range(got.shape[1])]}", flush=True)


if __name__ == "__main__":
    main()
