"""Token ids of the benchmark prompts, for bench_speculative.py / device_heads.sh (run locally, where
`specjax fetch` put the assets; the JSON travels to the GPU machine in .carry/b/):

    python benchmarks/make_prompt_ids.py .carry/b/prompt_ids.json

mtbench: the first user turn of the 80 questions in SmolLM2's chat template (generation prompt added),
with ``mtbench_category``; humaneval: the 164 raw prompts (code to complete, no chat template)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from specjax import prompts
from specjax.assets import asset_path
from specjax.files import atomic_write_text
from specjax.tokenizer import Tokenizer


def main(out: str):
    tok = Tokenizer.from_gguf(asset_path("smollm2-135m-instruct"))
    mt = prompts.mtbench()
    data = {"mtbench": [tok.apply_chat_template([{"role": "user", "content": q["prompt"]}]) for q in mt],
            "mtbench_category": [q["category"] for q in mt],
            "humaneval": [tok.encode(t["prompt"]) for t in prompts.humaneval()]}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(out), json.dumps(data))
    print(f"{out}: " + ", ".join(f"{k} {len(v)}" for k, v in data.items()))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "prompt_ids.json")
