"""Tokenizer: golden ids from transformers (SmolLM2 GGUF), plus tiny GGUF / tokenizer.json built here."""

import json
from pathlib import Path

import gguf
import jinja2
import pytest
from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers

from specjax import assets
from specjax.tokenizer import Tokenizer

GOLDEN = json.loads((Path(__file__).parent / "fixtures" / "smollm2_tokenizer_golden.json").read_text())
SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM"


@pytest.fixture(scope="module")
def smol():
    path = assets.home() / assets.MODELS["smollm2-135m-instruct"].dest
    if not path.is_file():
        pytest.skip(f"{path} missing: run `specjax fetch` (or `make test`, which fetches)")
    return Tokenizer.from_gguf(path)


@pytest.mark.assets
@pytest.mark.parametrize("case", GOLDEN["texts"], ids=lambda c: repr(c["text"][:20]))
def test_gguf_encode_decode_match_transformers(smol, case):
    assert smol.encode(case["text"], add_special_tokens=False) == case["ids"]
    assert smol.encode(case["text"]) == case["ids"]  # SmolLM2 adds no BOS
    assert smol.decode(case["ids"], skip_special_tokens=False) == case["decoded"] == case["text"]
    assert smol.decode(case["ids"]) == case["decoded_skip_special"]


@pytest.mark.assets
@pytest.mark.parametrize("case", GOLDEN["chats"], ids=lambda c: f"{len(c['messages'])}msg-gen{c['add_generation_prompt']}")
def test_gguf_chat_template_matches_transformers(smol, case):
    assert smol.apply_chat_template(case["messages"], case["add_generation_prompt"]) == case["ids"]


@pytest.mark.assets
def test_gguf_special_ids_and_default_system_prompt(smol):
    assert smol.vocab_size == GOLDEN["vocab_size"]
    assert [smol.backend.id_to_token(i) for i in smol.eos_token_ids] == ["<|im_end|>"]
    assert smol.backend.id_to_token(smol.bos_token_id) == "<|im_start|>"
    user = [{"role": "user", "content": "Hi"}]
    assert SMOLLM_SYSTEM in smol.render_chat(user)
    assert SMOLLM_SYSTEM not in smol.render_chat([{"role": "system", "content": "Be brief."}] + user)
    assert smol.render_chat(user).endswith("<|im_start|>assistant\n")
    assert not smol.render_chat(user, add_generation_prompt=False).endswith("assistant\n")


@pytest.mark.assets
def test_gguf_errors(smol):
    with pytest.raises(ValueError, match="non-empty list"):
        smol.apply_chat_template([])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        smol.decode([smol.vocab_size])
    with pytest.raises(ValueError, match=r"token ids \[-1\] are outside"):
        smol.decode_batch([[1, 2], [3, -1]])


@pytest.mark.assets
def test_decode_batch_matches_the_golden_decodes(smol):
    cases = GOLDEN["texts"]
    assert smol.decode_batch([c["ids"] for c in cases]) == [c["decoded_skip_special"] for c in cases]
    assert smol.decode_batch([c["ids"] for c in cases], skip_special_tokens=False) == [c["decoded"] for c in cases]
    assert smol.decode_batch([]) == [] and smol.decode_batch([[]]) == [""]
    with pytest.raises(TypeError, match="expects a str"):
        smol.encode(["not", "a", "str"])


BYTES = sorted(pre_tokenizers.ByteLevel.alphabet())
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _write_gguf(path, pre, model="gpt2", add_bos=False):
    tokens = SPECIALS + BYTES + ["ĠĠ"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    w.add_token_merges(["Ġ Ġ"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(add_bos)
    for step in (w.write_header_to_file, w.write_kv_data_to_file, w.write_tensors_to_file, w.close):
        step()
    return path


def test_gguf_pretokenizer_follows_ggml_pre(tmp_path):
    """"smollm" splits digits first, so the two spaces before "1" merge; plain GPT-2 keeps " 1" together."""
    smollm = Tokenizer.from_gguf(_write_gguf(tmp_path / "a.gguf", "smollm"))
    gpt2 = Tokenizer.from_gguf(_write_gguf(tmp_path / "b.gguf", "gpt2"))
    tok = smollm.backend.token_to_id
    assert smollm.encode("x  1") == [tok("x"), tok("ĠĠ"), tok("1")]
    assert gpt2.encode("x  1") == [tok("x"), tok("Ġ"), tok("Ġ"), tok("1")]
    assert smollm.chat_template is None and smollm.eos_token_ids == (2,)
    with pytest.raises(ValueError, match="no chat template"):
        smollm.apply_chat_template([{"role": "user", "content": "hi"}])
    with_bos = Tokenizer.from_gguf(_write_gguf(tmp_path / "c.gguf", "smollm", add_bos=True))
    assert with_bos.encode("hi") == [1, tok("h"), tok("i")] and with_bos.encode("hi", add_special_tokens=False)[0] != 1
    with pytest.raises(ValueError, match="unsupported tokenizer.ggml.pre 'weird'"):
        Tokenizer.from_gguf(_write_gguf(tmp_path / "d.gguf", "weird"))
    with pytest.raises(ValueError, match="only 'gpt2'"):
        Tokenizer.from_gguf(_write_gguf(tmp_path / "e.gguf", "smollm", model="llama"))


TEMPLATE = ("{% if messages[0]['role'] == 'bad' %}{{ raise_exception('bad role') }}{% endif %}"
            "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] | tojson }}{{ eos_token }}"
            "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture
def hf_dir(tmp_path):
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>", "<eot>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello world <b>", "héllo wörld & more words"] * 20, trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "chat_template": TEMPLATE}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, tok.token_to_id("<eot>")]}))
    return tmp_path


def test_from_hf_dir(hf_dir):
    tok = Tokenizer.from_hf_dir(hf_dir)
    assert tok.bos_token_id == 0 and tok.eos_token_ids == (1, 2)
    for text in ["hello world", "héllo <b> & 😀 wörld", ""]:
        assert tok.decode(tok.encode(text)) == text
    msgs = [{"role": "user", "content": "héllo <b>"}]
    rendered = tok.render_chat(msgs)
    assert rendered == '<s><user>"héllo <b>"</s><assistant>'  # tojson keeps non-ASCII and HTML as is
    assert tok.apply_chat_template(msgs) == tok.encode(rendered, add_special_tokens=False)
    assert tok.apply_chat_template(msgs)[0] == 0 and tok.decode(tok.apply_chat_template(msgs)) == '<user>"héllo <b>"<assistant>'
    with pytest.raises(jinja2.TemplateError, match="bad role"):
        tok.apply_chat_template([{"role": "bad", "content": "x"}])
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        Tokenizer.from_hf_dir(hf_dir / "nowhere")
