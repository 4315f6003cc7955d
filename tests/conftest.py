"""Markers: `gpu` tests skip (with the reason shown) unless a Hopper GPU is visible."""

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
    if _hopper():
        return
    skip = pytest.mark.skip(reason=f"needs a Hopper GPU; this host runs JAX on {jax.devices()[0].platform}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
