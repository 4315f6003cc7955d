"""Probe (CPU, needs ``ptxas``): do the FA3 kernel's register spills come from wgmma descriptors that LLVM hoisted
out of the KV loops? Takes a PTX dump of the kernel (``MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_TO=DIR`` on the GPU
machine), runs ``ptxas -v`` on it as dumped, then on a copy in which the 64-bit descriptor computations
(``add/or/bfe .64 %rdN`` in a loop's preheader) are moved to the top of the loop
body, so they are computed every iteration, as they are when the ring slot changes from step to step.

    python3 benchmarks/ptx_hoist_probe.py entry_0.ptx[.gz] [--ptxas ptxas] [--maxnreg-consumer 232]

Prints, for each form, ptxas's spill line. Only the register allocation is compared; the moved copy is not run.
"""
import argparse
import gzip
import re
import subprocess
import tempfile

DESC = re.compile(r"\s*(add|or|bfe)\.[su]?\w*64\s+%rd\d+,")


def sink(lines: list[str]) -> tuple[list[str], int]:
    """Moves hoisted descriptor computations into every loop whose preheader holds them: LLVM emits a
    ``fori_loop`` as ``@%p bra EXIT; <preheader>; bra.uni HEADER; <latch>; HEADER: <body>``; the
    preheader's ``add/or/bfe .64`` lines go to the top of HEADER's block."""
    out, moved_total, i = list(lines), 0, 0
    while i < len(out):
        if not re.search(r"@%p\d+ bra \t\$L__BB\d+_\d+;", out[i]):
            i += 1
            continue
        j = i + 1   # the preheader ends at the first label or unconditional branch
        while j < len(out) and not re.match(r"\$L__BB\d+_\d+:", out[j]) and "bra.uni \t$L__BB" not in out[j]:
            j += 1
        m = re.search(r"bra\.uni \t(\$L__BB\d+_\d+);", out[j]) if j < len(out) else None
        moved = [x for x in out[i + 1:j] if DESC.match(x)]
        if m and len(moved) >= 8:  # a preheader full of descriptors (16 + 16 + 8 at hd 256, 128-key blocks)
            head = next(k for k, x in enumerate(out) if x.startswith(m.group(1) + ":"))
            assert head > j, "the loop header follows its preheader"
            out = (out[:i + 1] + [x for x in out[i + 1:j] if not DESC.match(x)] + out[j:head + 1] + moved
                   + out[head + 1:])
            moved_total += len(moved)
        i = j + 1
    return out, moved_total


def ptxas_spills(text: str, ptxas: str) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(text)
        f.flush()
        r = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", "/dev/null"], capture_output=True, text=True)
    lines = [x.strip() for x in (r.stdout + r.stderr).splitlines() if "spill" in x and "bytes stack frame" in x]
    return lines[0] if lines else (r.stdout + r.stderr).strip()[-300:]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("ptx")
    ap.add_argument("--ptxas", default="ptxas")
    ap.add_argument("--maxnreg-consumer", type=int, default=None,
                    help="also rewrite setmaxnreg to N for the consumers and 64 * 1024 / 128 - 2 * N for the producer")
    a = ap.parse_args(argv)
    text = (gzip.open if a.ptx.endswith(".gz") else open)(a.ptx, "rt").read()
    if a.maxnreg_consumer:
        n = a.maxnreg_consumer
        text = re.sub(r"setmaxnreg\.inc\.sync\.aligned\.u32 \d+", f"setmaxnreg.inc.sync.aligned.u32 {n}", text)
        text = re.sub(r"setmaxnreg\.dec\.sync\.aligned\.u32 \d+", f"setmaxnreg.dec.sync.aligned.u32 {512 - 2 * n}", text)
    sunk, moved = sink(text.split("\n"))
    print(f"{a.ptx}: as dumped: {ptxas_spills(text, a.ptxas)}")
    print(f"{a.ptx}: {moved} descriptor computations moved into their loops: {ptxas_spills(chr(10).join(sunk), a.ptxas)}")


if __name__ == "__main__":
    main()
