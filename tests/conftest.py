"""Markers: `gpu` tests skip (with the reason shown) unless a Hopper GPU is visible; `slow` tests
run only when asked for with `-m slow`."""

import os

import jax
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _hopper() -> bool:
    try:
        d = jax.devices()[0]
    except RuntimeError:
        return False
    return d.platform == "gpu" and str(getattr(d, "compute_capability", "")).startswith("9.0")


def pytest_collection_modifyitems(config, items):
    slow = pytest.mark.skip(reason="slow test: run with `pytest -m slow`")
    gpu = pytest.mark.skip(reason=f"needs a Hopper GPU; this host runs JAX on {jax.devices()[0].platform}")
    hopper, asked = _hopper(), config.getoption("-m") or ""
    for item in items:
        if "slow" in item.keywords and "slow" not in asked:
            item.add_marker(slow)
        if "gpu" in item.keywords and not hopper:
            item.add_marker(gpu)
