"""Clock and power while the FA3 forward and cuDNN run the long non-causal rows, where their readings spread 5-10 %
within one process (pallas_kernels/NOTES.md v28). Each implementation runs back to back for ``--seconds`` per window
(``bench_fa3.sustained_ms`` without its warm-up; v29's calls synchronised every 10 calls, it every ~0.1 s), the two
alternating for ``--windows`` windows each, while ``nvidia-smi`` samples the SM clock, board power and the
active clock-throttle reasons every 50 ms. Per window: TFLOPS, mean SM clock, mean power, energy per call, and the
throttle reasons seen (a bit mask, NVML's ``clocksThrottleReasons``: 0x4 software power cap, 0x20 software thermal,
0x40 hardware thermal, 0x80 hardware power brake).

    PYTHONPATH=.:benchmarks python3 benchmarks/fa3_power_probe.py [--rows 128:16384:n,256:8192:n] [--seconds 3]
        [--windows 3]
"""

import argparse
import datetime
import pathlib
import statistics
import subprocess
import tempfile
import time

import jax
import jax.numpy as jnp

from bench_fa3 import _impls, parse_rows, sustained_ms

_QUERY = "timestamp,clocks.sm,power.draw,{}.active"
_REASONS = ("clocks_event_reasons", "clocks_throttle_reasons")   # newer drivers' name, then the older one


def _query() -> str:
    """``_QUERY`` with the throttle-reason field name this driver's nvidia-smi accepts."""
    for name in _REASONS:
        q = _QUERY.format(name)
        probe = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True)
        if probe.returncode == 0:
            return q
    raise SystemExit(f"nvidia-smi accepts neither of {_REASONS} as a query field")


def parse_samples(text: str) -> list[tuple[float, float, float, int]]:
    """nvidia-smi's CSV lines (``_query()``, no header, no units) as (unix time, SM MHz, watts, throttle mask)."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            out.append((t, float(parts[1]), float(parts[2]), int(parts[3], 16)))
        except ValueError:   # a line cut by the sampler's stop, or "[N/A]"
            continue
    return out


def window_stats(samples, t0: float, t1: float, skip: float = 0.3) -> dict | None:
    """Mean clock and power, and the OR of the throttle masks, over the samples inside [t0 + skip, t1]."""
    inside = [s for s in samples if t0 + skip <= s[0] <= t1]
    if not inside:
        return None
    mask = 0
    for s in inside:
        mask |= s[3]
    return {"n": len(inside), "mhz": statistics.mean(s[1] for s in inside),
            "watts": statistics.mean(s[2] for s in inside), "throttle": mask}


class Sampler:
    """``nvidia-smi`` sampling the SM clock, board power and clock-event reasons every 50 ms into a temporary file
    from construction to ``stop()``; ``samples()`` reads what it has written so far."""

    def __init__(self):
        self._file = tempfile.NamedTemporaryFile("r", suffix=".csv")
        self._proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={_query()}", "--format=csv,noheader,nounits",
                                       "-lms", "50", "-f", self._file.name])
        time.sleep(1.0)

    def samples(self) -> list[tuple[float, float, float, int]]:
        return parse_samples(pathlib.Path(self._file.name).read_text())   # by name: nvidia-smi -f opens it anew

    def stop(self) -> None:
        self._proc.terminate()
        self._proc.wait()
        self._file.close()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="128:16384:n,256:8192:n", help="hd:S:(n|c) rows, comma-separated")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--windows", type=int, default=3)
    a = ap.parse_args(argv)
    if a.seconds <= 0 or a.windows < 1:
        ap.error(f"--seconds must be > 0 and --windows >= 1, got {a.seconds} and {a.windows}")
    try:
        rows = parse_rows(a.rows)
    except ValueError as e:
        ap.error(str(e))
    print(subprocess.run(["nvidia-smi", "--query-gpu=name,power.limit,clocks.max.sm", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip(), f"jax {jax.__version__}")
    for hd, S, causal in rows:
        (B, S, H, d), impls = _impls(S, hd, causal, jnp.bfloat16, None)
        fns = {n: impls[n] for n in ("specjax", "cudnn")}
        q, k, v = (jax.random.normal(kk, (B, S, H, d), jnp.bfloat16) for kk in jax.random.split(jax.random.key(0), 3))
        for f in fns.values():
            jax.block_until_ready(f(q, k, v))
        flops = 4 * B * S * S * H * d / (2 if causal else 1)
        sampler, windows = Sampler(), []
        for w in range(a.windows):
            for name in fns if w % 2 == 0 else list(fns)[::-1]:
                spans = []
                ms = sustained_ms(fns[name], (q, k, v), a.seconds, warm=0.0, spans=spans)
                if ms is None:
                    raise SystemExit(f"{name} failed at hd {hd} S {S} (its error is printed above)")
                windows.append((name, spans[0][1], spans[0][2], ms))
                time.sleep(0.5)
        samples = sampler.samples()
        sampler.stop()
        print(f"hd {hd} S {S} {'causal' if causal else 'non-causal'}: {len(samples)} samples")
        per = {n: [] for n in fns}
        for name, t0, t1, ms in windows:
            n = round((t1 - t0) / ms * 1e3)
            st = window_stats(samples, t0, t1)
            tf = flops / ms / 1e9
            line = f"  {name:8s} {tf:6.0f} TFLOPS ({n} calls, {ms:.3f} ms)"
            if st:
                line += (f"; SM {st['mhz']:.0f} MHz, {st['watts']:.0f} W, {st['watts'] * ms:.1f} mJ/call, "
                         f"{tf / st['watts']:.3f} TFLOPS/W, throttle 0x{st['throttle']:x} ({st['n']} samples)")
                per[name].append((tf, st["mhz"], st["watts"]))
            print(line)
        for name, xs in per.items():
            if xs:
                print(f"  {name}: median {statistics.median(x[0] for x in xs):.0f} TFLOPS, "
                      f"{statistics.median(x[1] for x in xs):.0f} MHz, {statistics.median(x[2] for x in xs):.0f} W, "
                      f"{statistics.median(x[0] / x[2] for x in xs):.3f} TFLOPS/W")


if __name__ == "__main__":
    main()
