"""Markers: `gpu` tests skip (with the reason shown) unless a Hopper GPU is visible; `slow` tests
run only when asked for with `-m slow`."""

import importlib.metadata
import importlib.util
import os
import platform

import jax
import pytest

if importlib.util.find_spec("xdist"):  # pytest-xdist, a dev dependency: `make test`'s -n 2 survives a crashed worker
    from xdist_recovery import pytest_xdist_make_scheduler  # noqa: F401  (a hook)


def _cuda_plugin_installed() -> bool:
    """Whether a jax CUDA plugin is installed (read from package metadata, before JAX picks a backend)."""
    return any((d.metadata["Name"] or "").lower().replace("_", "-").startswith("jax-cuda")
               for d in importlib.metadata.distributions())


_CUDA = _cuda_plugin_installed()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# The Mosaic GPU interpreter runs each warpgroup of a kernel as its own XLA CPU execution, and their
# barrier waits block threads of XLA's CPU thread pool, which has one thread per core. On a 2-core host
# a kernel of 4 warpgroups (3 consumers + producer) could then deadlock: the warpgroup that would
# complete a barrier found no thread free (seen as hangs of the FA3 interpreter tests; with the test
# pinned to one core it hung, with this pool 25 interpreter tests passed on one core). A larger pool,
# set before JAX creates its CPU client, removes that; a model test took the same time with it (bf16
# n-gram test 38.1 vs 37.8 s; benchmarks/results/interpreter_hang_cpu_2026-11-29.txt).
os.environ.setdefault("PJRT_NPROC", str(max(8, os.cpu_count() or 1)))
# XLA's CPU code for AVX2 on every x86-64 host. With AVX-512, XLA vectorises a 5-row interpreted kernel's
# unrolled row loop otherwise than the 1-row kernel's, so bitwise tests (row m of a verify call == a 1-row
# decode call) failed by 1 ulp in every run on an AVX-512 host; with AVX2 code they pass there (and passed on
# the earlier CI hosts): the same kernel, another vectoriser.
# Pinned, the suite's arithmetic no longer depends on which CI host it lands on (same run time,
# benchmarks/results/ci_time_cpu_2026-12-02b.txt).
if platform.machine().lower() in ("x86_64", "amd64") and "xla_cpu_max_isa" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_max_isa=AVX2").strip()

# Test files whose time is mostly XLA compiling small programs or the Mosaic GPU interpreter's
# per-warpgroup programs. On a host without a JAX CUDA plugin their compiles run XLA's backend at
# optimization level 0 (``_compile_fast``): 21 FA3 interpreter tests took 89 s instead of 133 s that way
# (benchmarks/NOTES.md item 55). Tests in them marked ``execution_bound`` (test_training's whole pipelines)
# keep XLA's defaults, as every other file does: their compiled code runs long enough that optimized code
# pays for its compile (test_lossless's samples: 223 s at the defaults, 382 s at level 0; item 56). Level 0
# for every test (item 56) was tried and taken back: the first CI run of it had a worker segfault inside
# XLA's compiler, and then hung (item 57); this per-file set had passed CI three times.
COMPILE_BOUND = {"test_flash_attention.py", "test_flash_attention_bwd.py", "test_decode_attention.py",
                 "test_fused.py", "test_move_rows.py", "test_skinny_gemm.py", "test_training.py"}


@pytest.fixture(autouse=True)
def _compile_fast(request, monkeypatch):
    """In ``COMPILE_BOUND`` files on a host without a CUDA plugin, unless the test is marked ``execution_bound``:
    every compile in the test (and, through ``XLA_FLAGS``, in the processes it starts) at
    ``xla_backend_optimization_level=0``."""
    if _CUDA or request.path.name not in COMPILE_BOUND or request.node.get_closest_marker("execution_bound"):
        return
    from jax._src import compiler  # no public per-process default for XLA's debug options

    plain = compiler.get_compile_options

    def level0(*args, **kwargs):
        options = plain(*args, **kwargs)
        options.executable_build_options.debug_options.xla_backend_optimization_level = 0
        return options
    monkeypatch.setattr(compiler, "get_compile_options", level0)
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_backend_optimization_level" not in flags:  # a level set by the caller stays
        monkeypatch.setenv("XLA_FLAGS", (flags + " --xla_backend_optimization_level=0").strip())


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
