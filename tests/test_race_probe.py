"""The race check the Mosaic GPU kernels rely on: the GPU interpreter's race detector, on the probe kernel of
benchmarks/racecheck_probe.py (warpgroup 1 reads shared memory that warpgroup 0 fills by stores or by a TMA copy).
On an H100, compute-sanitizer's racecheck reported 0 hazards for both races of this probe while their outputs
showed them (results/fa3_racecheck_H100_2026-12-07.txt; pallas_kernels/NOTES.md "Race checks"). So the FA3
kernels' race tests (``test_interpreter_*finds_no_races``) run this detector, and this file shows it sees such races."""

import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jax._src.pallas.mosaic_gpu.interpret.interpret_pallas_call import get_races
from jax.experimental.pallas import mosaic_gpu as plgpu

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from racecheck_probe import probe  # noqa: E402


@pytest.mark.parametrize("tma", [False, True], ids=["stores", "tma"])
def test_interpreter_race_detector_flags_the_probe_race_and_passes_its_synchronised_form(tma):
    for race in (False, True):
        with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams(detect_races=True)):
            out = jax.block_until_ready(probe(race, tma))
        assert get_races().races_found == race, f"race={race}"
        if not race:
            np.testing.assert_array_equal(np.asarray(out), 2.0)
