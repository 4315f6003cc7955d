"""The CLI contract: JSON rows per prompt, and clear errors with a nonzero exit and empty stdout."""

import json

import jax
import pytest
from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers

from specjax import config, model
from specjax.cli import main
from specjax.loading import export_hf

TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny random Llama saved as an HF folder with its own BPE tokenizer and chat template."""
    d = tmp_path_factory.mktemp("tiny")
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 10, trainer)
    cfg = config.tiny(vocab_size=tok.get_vocab_size(), max_seq_len=256, eos_token_ids=(1,), bos_token_id=0)
    export_hf(model.init_params(cfg, jax.random.key(0), scale=0.1), cfg, d)
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>",
                                                         "chat_template": TEMPLATE}))
    return d


def run(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_generate_json_rows_in_input_order(tiny_dir, tmp_path, capsys):
    pf = tmp_path / "p.jsonl"
    pf.write_text('{"prompt": "the quick fox"}\n\n{"prompt": "lazy dog jumps over"}\n')
    code, out, err = run(capsys, "generate", "--model", str(tiny_dir), "--prompts-file", str(pf),
                         "--max-new-tokens", "5", "--json")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 2
    for row in rows:
        for key in ("prompt_ids", "output_ids", "text", "new_tokens", "seconds", "tokens_per_s"):
            assert key in row
        assert 1 <= row["new_tokens"] == len(row["output_ids"]) <= 5
    assert len(rows[0]["prompt_ids"]) != len(rows[1]["prompt_ids"])  # input order kept


def test_generate_speculative_adds_metrics(tiny_dir, capsys):
    code, out, err = run(capsys, "generate", "--model", str(tiny_dir), "--prompt", "the lazy dog", "--chat",
                         "--max-new-tokens", "6", "--method", "ngram", "--num-draft", "3", "--json")
    assert code == 0, err
    row = json.loads(out)
    assert row["mean_accepted"] >= 1 and len(row["acceptance_per_position"]) == 3 and row["num_cycles"] >= 1
    assert row["ttft_s"] is None  # one program unless --ttft
    code, out, err = run(capsys, "generate", "--model", str(tiny_dir), "--prompt", "the lazy dog", "--chat",
                         "--max-new-tokens", "6", "--method", "ngram", "--num-draft", "3", "--json", "--ttft")
    assert code == 0, err
    timed = json.loads(out)
    assert 0 < timed["ttft_s"] < timed["seconds"] and timed["output_ids"] == row["output_ids"]
    assert row["mean_drafted"] == 3.0  # a fixed chain proposes K per cycle


def test_generate_adaptive_draft_chain(tiny_dir, capsys):
    """--min-confidence: the model as its own draft stops each chain after a low-probability draft (a random tiny
    model is never sure: every chain stops after its first draft) and still gives AR's greedy tokens."""
    base = ["generate", "--model", str(tiny_dir), "--prompt", "the lazy dog", "--max-new-tokens", "6", "--json"]
    code, out, err = run(capsys, *base)
    assert code == 0, err
    ar = json.loads(out)
    code, out, err = run(capsys, *base, "--method", "draft", "--draft-model", str(tiny_dir), "--num-draft", "3",
                         "--min-confidence", "0.5")
    assert code == 0, err
    row = json.loads(out)
    assert row["output_ids"] == ar["output_ids"] and row["mean_drafted"] == 1.0 and row["mean_accepted"] == 2.0


@pytest.mark.parametrize("args, message", [
    (["--model", "no-such-model"], "unknown model"),
    (["--prompt", "   "], "empty prompt"),
    (["--max-new-tokens", "0"], "max-new-tokens must be > 0"),
    (["--temperature", "-1"], "temperature must be >= 0"),
    (["--top-p", "0"], "top_p must be in"),
    (["--top-p", "1.5"], "top_p must be in"),
    (["--method", "telepathy"], "unknown --method"),
    (["--method", "ngram", "--num-draft", "0"], "num_draft"),
    (["--method", "ngram", "--min-confidence", "0.3"], "option of the draft method"),
    (["--prompt", "fox " * 400], "exceeds the model's context"),
])
def test_bad_input_is_a_clear_error(tiny_dir, capsys, args, message):
    opts = {"--model": str(tiny_dir), "--prompt": "the fox", "--max-new-tokens": "4"}
    opts.update(zip(args[::2], args[1::2]))
    code, out, err = run(capsys, "generate", *[x for kv in opts.items() for x in kv])
    assert code != 0 and out == "" and message in err


def test_missing_assets_say_to_fetch(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECJAX_HOME", str(tmp_path))
    code, out, err = run(capsys, "generate", "--prompt", "hi")
    assert code != 0 and out == "" and "specjax fetch" in err


def test_corrupt_and_truncated_gguf(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)
    code, out, err = run(capsys, "generate", "--model", str(bad), "--prompt", "hi")
    assert code != 0 and out == "" and "bad.gguf" in err
    monkeypatch.setenv("SPECJAX_HOME", str(tmp_path))  # a registered model whose bytes are wrong
    reg = tmp_path / "models" / "smollm2-135m-instruct.gguf"
    reg.parent.mkdir()
    reg.write_bytes(b"GGUF" + b"\x00" * 1000)
    code, out, err = run(capsys, "generate", "--prompt", "hi")
    assert code != 0 and out == "" and "sha256" in err


def test_generate_compute_float32(tiny_dir, capsys):
    """--compute float32 runs (float32 weights: same tokens as the default) and a bad value is rejected."""
    outs = []
    for compute in ("param", "float32"):
        code, out, err = run(capsys, "generate", "--model", str(tiny_dir), "--prompt", "the lazy dog",
                             "--max-new-tokens", "5", "--method", "ngram", "--compute", compute, "--json")
        assert code == 0, err
        outs.append(json.loads(out)["output_ids"])
    assert outs[0] == outs[1]
    with pytest.raises(SystemExit) as e:
        main(["generate", "--model", str(tiny_dir), "--prompt", "the fox", "--compute", "bfloat16"])
    out = capsys.readouterr()
    assert e.value.code == 2 and out.out == "" and "invalid choice: 'bfloat16'" in out.err
