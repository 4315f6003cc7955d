"""Does compute-sanitizer's racecheck see a race in a Mosaic GPU kernel, through the ``--kernel-name kns=fa3_``
filter that benchmarks/fa3_racecheck_gpu.sh uses? A tiny kernel named ``fa3_probe``: warpgroup 0 fills 128
floats of shared memory (``--tma``: by a TMA copy from global memory, as the FA3 producer does; else by stores
from registers) and warpgroup 1 reads them back and writes them out, plus one.

  --race: no synchronisation between the fill and the load (a read-after-write hazard racecheck must report);
  default: warpgroup 1 first waits on an mbarrier that the fill completes (0 hazards expected).

  compute-sanitizer --tool racecheck --kernel-name kns=fa3_ python3 benchmarks/racecheck_probe.py [--race] [--tma]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

N = 128


def probe(race: bool, tma: bool = False) -> jax.Array:
    def body(x_ref, out_ref, smem, ready):
        wg = lax.axis_index("wg")

        @pl.when(wg == 0)
        def _():
            if tma:   # the copy's completion arrives on ``ready``
                plgpu.copy_gmem_to_smem(x_ref, smem, ready)
            else:
                smem[...] = plgpu.layout_cast(jnp.full((N,), 1.0, jnp.float32),
                                              plgpu.Layout.WG_STRIDED((N,), vec_size=1))
                plgpu.commit_smem()
                plgpu.barrier_arrive(ready)

        @pl.when(wg == 1)
        def _():
            if not race:
                plgpu.barrier_wait(ready)
            out_ref[...] = smem[...] + 1.0

    def entry(x_ref, out_ref):
        pl.run_scoped(lambda smem, ready: body(x_ref, out_ref, smem, ready), plgpu.SMEM((N,), jnp.float32),
                      plgpu.Barrier(num_arrivals=1), collective_axes="wg")

    return plgpu.kernel(entry, out_type=jax.ShapeDtypeStruct((N,), jnp.float32), num_threads=2,
                        thread_name="wg", kernel_name="fa3_probe")(jnp.ones((N,), jnp.float32))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--race", action="store_true", help="warpgroup 1 does not wait for the fill")
    ap.add_argument("--tma", action="store_true", help="fill shared memory by a TMA copy, not by stores")
    a = ap.parse_args(argv)
    out = jax.block_until_ready(probe(a.race, a.tma))
    print(f"race={a.race} tma={a.tma}: out[:4] = {out[:4].tolist()} (2.0 once the fill is seen)")


if __name__ == "__main__":
    main()
