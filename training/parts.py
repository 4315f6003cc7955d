"""The finished pieces of a corpus build, kept on disk so that a build cut off resumes where it stopped.

A build on the lent GPU machine can outlast one device call (the h100-diverse corpus: 355 s of generation in 19
pieces plus ~90 s of filtering and packing on an H200; an H100 took twice an H200's time for the h100 corpus;
a call lasts 10 minutes), and a machine can go back before the build ends.
``build_corpus`` therefore writes each piece as it finishes — the sampled Magpie queries, then the responses
in slices of ``PART_BATCHES`` generation batches — into ``<corpus>/parts``, each file written atomically. A
rerun with the same spec loads the pieces it finds and generates only the rest; the pieces carry the
per-batch seeds of one uninterrupted run, so the result is the same corpus (on one machine; bf16 batched
sampling is not bitwise reproducible across runs, see benchmarks/NOTES.md item 24). The folder can also be
carried to another machine (``benchmarks/device_heads.sh``: ``CORPUS_OUT``, ``.carry/corpus``). Pieces of
another spec are deleted on open.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

from specjax.files import atomic_write, atomic_write_text

PART_BATCHES = 4  # generation batches per response piece (4096 prompts at the h100 presets' batch: ~5 s of an H200
#                   once compiled, 18-54 s with a compilation, benchmarks/NOTES.md item 25)

Pairs = list[tuple[list[int], list[int]]]


class PartStore:
    """One corpus build's pieces in ``folder``: ``texts`` and ``pairs`` return a stored piece or make and store it."""

    def __init__(self, folder: str | Path, spec_json: dict, log: Callable[[str], None] = print):
        self.folder, self.log = Path(folder), log
        tag = self.folder / "spec.json"
        if self.folder.is_dir() and (not tag.is_file() or json.loads(tag.read_text()) != spec_json):
            log(f"corpus: {self.folder} holds pieces of another spec; deleting them")
            shutil.rmtree(self.folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(tag, json.dumps(spec_json))
        self.reused = self.made = 0
        self.generate_seconds = 0.0  # summed over the pieces, whichever invocation made them
        self._lock = threading.Lock()  # pieces may be made by several threads at once (training/pool.py)

    def texts(self, name: str, make: Callable[..., list[str]], *args, **kwargs) -> list[str]:
        """``make(*args, **kwargs)``, or the list an earlier call stored under ``name``."""
        path = self.folder / f"{name}.json"
        if path.is_file():
            rec = json.loads(path.read_text())
            self._count(reused=True, seconds=rec["seconds"])
            return rec["texts"]
        t0 = time.perf_counter()
        texts = make(*args, **kwargs)
        rec = {"texts": texts, "seconds": round(time.perf_counter() - t0, 2)}
        atomic_write_text(path, json.dumps(rec))
        self._count(reused=False, seconds=rec["seconds"], name=name, n=len(texts))
        return texts

    def pairs(self, name: str, make: Callable[..., Pairs], *args, **kwargs) -> Pairs:
        """``make(*args, **kwargs)`` -> (prompt ids, response ids) pairs, or those an earlier call stored."""
        path = self.folder / f"{name}.npz"
        if path.is_file():
            with np.load(path) as z:
                flat, prompt_len, row_len = z["tokens"].tolist(), z["prompt_len"], z["row_len"]
                self._count(reused=True, seconds=float(z["seconds"]))
            starts = (np.cumsum(row_len) - row_len).tolist()
            return [(flat[s:s + p], flat[s + p:s + n])
                    for s, n, p in zip(starts, row_len.tolist(), prompt_len.tolist())]
        t0 = time.perf_counter()
        pairs = make(*args, **kwargs)
        seconds = time.perf_counter() - t0

        def write(tmp):
            with open(tmp, "wb") as f:
                flat = np.array([t for p, r in pairs for t in p + r], np.int64)
                small = flat.size == 0 or flat.max() < 2 ** 16  # SmolLM2's 49152 ids: half the bytes to carry
                np.savez_compressed(f, tokens=flat.astype(np.uint16 if small else np.int32),
                                    prompt_len=np.array([len(p) for p, _ in pairs], np.int32),
                                    row_len=np.array([len(p) + len(r) for p, r in pairs], np.int32),
                                    seconds=np.float64(seconds))
        atomic_write(path, write)
        self._count(reused=False, seconds=seconds, name=name, n=len(pairs))
        return pairs

    def _count(self, *, reused: bool, seconds: float, name: str = "", n: int = 0) -> None:
        with self._lock:
            self.generate_seconds += seconds
            if reused:
                self.reused += 1
            else:
                self.made += 1
                self.log(f"corpus: piece {name} ({n} rows) in {seconds:.0f}s")
