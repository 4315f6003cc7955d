"""How long ``specjax.load`` takes for a fetched model, with and without its GGUF header in the cache
(``specjax/loading/gguf_header.py``). Each load runs in a fresh process (as a CLI call or a notebook kernel
would), alternating: "first" with an empty ``$SPECJAX_HOME/cache`` (gguf parses the header, the entry is
written), "cached" right after it. Writes ``results/load_<device>_<date><tag>.{json,md}``.

    PYTHONPATH=. python3 benchmarks/load_time.py [--model smollm2-135m-instruct] [--repeats 3] [--tag _x]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import header, md_table, write_results

_CHILD = """
import time, specjax
t = time.perf_counter()
lm = specjax.load({model!r}, dtype="float32")
print(time.perf_counter() - t)
"""


def load_seconds(model: str, home: Path) -> float:
    """Seconds of ``specjax.load(model)`` in a new process whose ``$SPECJAX_HOME`` is ``home``."""
    env = {**os.environ, "SPECJAX_HOME": str(home), "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    out = subprocess.run([sys.executable, "-c", _CHILD.format(model=model)], env=env, capture_output=True,
                         text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tag", default="")
    a = ap.parse_args(argv)
    if a.repeats < 1:
        ap.error(f"--repeats takes a count >= 1, got {a.repeats}")
    from specjax import assets
    real = assets.home()
    with tempfile.TemporaryDirectory() as tmp:  # the fetched models, a cache of this run's own
        home = Path(tmp)
        (home / "models").symlink_to(real / "models", target_is_directory=True)
        if (real / assets._STAMP).is_file():  # the checksums' stamps: neither load rehashes the file
            shutil.copy(real / assets._STAMP, home / assets._STAMP)
        rows = []
        for i in range(a.repeats):
            shutil.rmtree(home / "cache", ignore_errors=True)
            first = load_seconds(a.model, home)
            cached = load_seconds(a.model, home)
            rows.append({"repeat": i, "first_s": round(first, 2), "cached_s": round(cached, 2)})
            print(rows[-1], flush=True)
    med = {k: statistics.median(r[k] for r in rows) for k in ("first_s", "cached_s")}
    payload = {**header(), "model": a.model, "cpus": os.cpu_count(), "rows": rows, "median": med}
    name = f"load_{payload['device'].lower()}_{payload['date']}{a.tag}"
    table = (f"`specjax.load({a.model!r}, dtype='float32')` in a fresh process, {payload['device']} "
             f"({os.cpu_count()} CPUs), jax {payload['jax']}, {payload['date']}; seconds\n\n"
             + md_table(rows + [{"repeat": "median", **med}], ["repeat", "first_s", "cached_s"]))
    print(table)
    write_results(name, payload, table)


if __name__ == "__main__":
    main()
