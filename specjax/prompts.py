"""Evaluation prompt sets (MT-bench, HumanEval) read from the `specjax fetch` cache.

These are evaluation data: never train on them.
"""

from __future__ import annotations

import json
from pathlib import Path

from specjax.assets import asset_path


def _jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def mtbench(first_turn_only: bool = True) -> list[dict]:
    """The 80 MT-bench questions as `{id, category, prompt}` (`prompt` = first user turn).

    With `first_turn_only=False` each record also carries `turns`, the list of all user turns
    (the second turn needs the model's first answer in between, so callers drive the dialogue).
    """
    out = []
    for q in _jsonl(asset_path("mtbench")):
        rec = {"id": q["question_id"], "category": q["category"], "prompt": q["turns"][0]}
        if not first_turn_only:
            rec["turns"] = list(q["turns"])
        out.append(rec)
    return out


def humaneval() -> list[dict]:
    """The 164 HumanEval tasks: `task_id`, `prompt` (code to complete), `entry_point`, `test`, ..."""
    return _jsonl(asset_path("humaneval"))
