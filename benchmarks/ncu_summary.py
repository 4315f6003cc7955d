"""Summary of an Nsight Compute export from ``fa3_ncu_gpu.sh`` (CPU; stdlib only): per profiled attention kernel
(this kernel's ``entry_mosaic_gpu_kernel`` and cuDNN's), its time, clock, instructions, shared-memory traffic,
pipe utilisation and warp-stall reasons from the raw metrics; from the SASS source page, the wgmma shapes it issues
(``HGMMA.MxNxK``, with A from registers or SMEM) and its ``setmaxnreg`` values.

    python3 benchmarks/ncu_summary.py DIR|RAW.csv.gz ...   # DIR holds ncu_raw.csv.gz (and ncu_source.csv.gz)
"""
import collections
import csv
import gzip
import io
import os
import re
import sys

METRICS = [  # (label, raw metric)
    ("time us", "gpu__time_duration.sum"),
    ("SM clock GHz", "sm__cycles_elapsed.avg.per_second"),
    ("grid", "launch__grid_size"),
    ("dyn. SMEM KB", "launch__shared_mem_per_block_dynamic"),
    ("instructions M", "smsp__inst_executed.sum"),
    ("issue active %", "sm__issue_active.avg.pct_of_peak_sustained_elapsed"),
    ("tensor pipe %", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed"),
    ("shared pipe %", "sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_elapsed"),
    ("SMEM wavefronts M", "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"),
    ("SMEM bank conflicts", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"),
    ("XU (MUFU) %", "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"),
]
STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
STALLS = ("barrier", "long_scoreboard", "wait", "short_scoreboard", "dispatch_stall", "gmma", "mio_throttle",
          "not_selected", "math_pipe_throttle")


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def _attention_rows(path):
    rows = list(csv.reader(io.StringIO(gzip.open(path, "rt").read())))
    hdr, data = rows[0], rows[2:]
    name = hdr.index("Kernel Name")
    return hdr, [r for r in data if "mosaic" in r[name] or "cudnn" in r[name]], name


def _sass(path):
    """Per attention kernel of the source page, in order: Counter of HGMMA shapes and the setmaxnreg values."""
    out, cur = [], None
    for line in gzip.open(path, "rt"):
        if line.startswith('"Kernel Name"'):
            cur = None
            if "mosaic" in line or "cudnn" in line:
                cur = (collections.Counter(), set())
                out.append(cur)
            continue
        if cur is None:
            continue
        op = next(csv.reader([line]), ["", ""])[1] if line.startswith('"0x') else ""
        if m := re.search(r"HGMMA\.(\d+x\d+x\d+)\S*\s+R\d+, (R\d+|gdesc)", op):
            cur[0][f"{m.group(1)} A from {'registers' if m.group(2).startswith('R') else 'SMEM'}"] += 1
        if m := re.search(r"USETMAXREG\.(\w+)\S*\s+(?:UP\d+, )?(0x[0-9a-f]+)", op):
            cur[1].add(f"{m.group(1).lower()} {int(m.group(2), 16)}")
    return out


def summarize(d: str) -> str:
    """``d``: a directory from ``fa3_ncu_gpu.sh``, or one raw-metrics file (``*.csv.gz``; no SASS then)."""
    raw, src = (d, "") if d.endswith(".csv.gz") else (os.path.join(d, "ncu_raw.csv.gz"), os.path.join(d, "ncu_source.csv.gz"))
    hdr, rows, name = _attention_rows(raw)
    sass = _sass(src) if os.path.exists(src) else [None] * len(rows)
    lines = [f"## {d}"]
    for r, s in zip(rows, sass):
        lines.append(f"- {r[name][:110]}")
        vals = []
        for label, key in METRICS:
            v = r[hdr.index(key)] if key in hdr else "-"
            if key.endswith("duration.sum"):
                v = f"{_num(v) * 1000:.1f}"  # ms -> us
            elif label.endswith(" M"):
                v = f"{_num(v) / 1e6:.1f}"
            vals.append(f"{label} {v}")
        lines.append("  " + "; ".join(vals))
        lines.append("  stalls per issued instruction: " + ", ".join(
            f"{k} {_num(r[hdr.index(STALL.format(k))]):.2f}" for k in STALLS if STALL.format(k) in hdr))
        if s is not None:
            lines.append("  SASS (static instruction counts): " + ", ".join(f"{n} x {k}" for k, n in sorted(s[0].items()))
                         + "; setmaxnreg " + ", ".join(sorted(s[1])))
    return "\n".join(lines)


if __name__ == "__main__":
    print("\n\n".join(summarize(d) for d in sys.argv[1:]))
