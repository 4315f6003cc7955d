"""The benchmarks' options: ``--head LABEL=FOLDER`` (the drafting method comes from the folder's config.json),
``--draft-vocab LABEL=full|eagle3|IDS.npy`` (the shipped draft model over its whole LM head or a cut one), the FA3
backward table's ``--variant NAME:FIELD=V,...``, the one-kernel backward's ablation variants, the FA3 power
probe's reading of nvidia-smi's samples and the FA3 table's ``--sustained`` measure."""

import argparse
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_speculative  # noqa: E402

SHIPPED = ROOT / "specjax" / "shipped" / "smollm2-135m-instruct"


@pytest.mark.parametrize("kind", ["eagle3", "medusa", "draft"])
def test_head_option_reads_the_kind_from_the_shipped_folders(kind):
    assert bench_speculative.head_option(f"new={SHIPPED / kind}") == ("new", (kind, str(SHIPPED / kind)))


def test_head_option_refuses_a_folder_of_no_known_kind(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    with pytest.raises(argparse.ArgumentTypeError, match="not a Medusa head, an EAGLE-3 head"):
        bench_speculative.head_option(f"x={tmp_path}")
    with pytest.raises(argparse.ArgumentTypeError, match="LABEL=FOLDER"):
        bench_speculative.head_option(str(tmp_path))


def test_bwd_variant_option_reads_backward_configs():
    import bench_fa3_bwd
    import jax.numpy as jnp
    assert bench_fa3_bwd.parse_variant("v1:block_q_dkv=64,block_kv_dq=64") == (
        "v1", dict(block_q_dkv=64, block_kv_dq=64))
    assert bench_fa3_bwd.parse_variant("one:fused_dq=1") == ("one", dict(fused_dq=True))
    # the fields replace a row's default: fused at hd 64 keeps its 128-row steps, at hd 256 it is refused
    shape, impls = bench_fa3_bwd._impls(1024, 64, False, jnp.bfloat16, False, [("one", dict(fused_dq=True))])
    assert "specjax_one" in impls
    shape, impls = bench_fa3_bwd._impls(1024, 256, False, jnp.bfloat16, False, [("one", dict(fused_dq=True))])
    assert "specjax_one" not in impls
    for bad, why in (("q128", "NAME:FIELD=VALUE"), ("x:blocks=2", "not FIELD=INT"), ("x:stages_dq=a", "not FIELD=INT"),
                     ("x:block_q_dkv=96", "block_q_dkv must be 64 or 128")):
        with pytest.raises(ValueError, match=why):
            bench_fa3_bwd.parse_variant(bad)


def test_bwd_fused_ablation_variants_apply_to_the_kernel_source(tmp_path):
    """Every variant's source replacements apply exactly once to the backward file as it is (else the probe stops
    before timing), and each variant imports."""
    import bwd_fused_ablation
    mods = bwd_fused_ablation._variants(tmp_path)
    assert set(mods) == {"full", *bwd_fused_ablation._VARIANTS}
    assert all(callable(m.flash_attention_bwd) for m in mods.values())


def test_power_probe_reads_nvidia_smi_samples_and_averages_a_window():
    """Lines cut by the sampler's stop or holding "[N/A]" are dropped; a window averages only its samples after its
    first ``skip`` seconds and ORs their throttle masks."""
    import fa3_power_probe
    text = ("2026/12/07 18:40:01.000, 1980, 500.0, 0x0000000000000000\n"
            "2026/12/07 18:40:01.500, 1700, 640.0, 0x0000000000000004\n"
            "2026/12/07 18:40:02.000, 1500, [N/A], 0x0000000000000004\n"
            "2026/12/07 18:40:02.500, 1600, 650.0, 0x0000000000000020\n"
            "2026/12/07 18:40:03.0")
    samples = fa3_power_probe.parse_samples(text)
    assert [(mhz, w, mask) for _, mhz, w, mask in samples] == [(1980, 500.0, 0), (1700, 640.0, 4), (1600, 650.0, 0x20)]
    t0 = samples[0][0]
    st = fa3_power_probe.window_stats(samples, t0, t0 + 1.6, skip=0.3)
    assert st == {"n": 2, "mhz": 1650.0, "watts": 645.0, "throttle": 0x24}
    assert fa3_power_probe.window_stats(samples, t0 + 10, t0 + 20) is None


def test_fa3_sustained_measure_times_only_after_its_warm_up_and_writes_its_table(tmp_path):
    """``bench_fa3 --sustained``: the calls of the untimed warm-up do not count, the timed window is wall time over
    calls (the batch sized from one timed call), a failure is None, and the table keeps the clock and power."""
    import json
    import jax
    import bench_fa3
    now = [0.0]

    def fn(x):  # 2 ms per call on a fake clock
        now[0] += 0.002
        return x
    spans = []
    ms = bench_fa3.sustained_ms(fn, (1,), seconds=1.0, warm=0.5, spans=spans, clock=lambda: now[0])
    assert ms == pytest.approx(2.0)
    (f, t0, t1), = spans
    assert f is fn and t0 == pytest.approx(0.004 + 0.5) and t1 - t0 == pytest.approx(1.0)  # 0.1 s batches
    assert bench_fa3.sustained_ms(lambda x: 1 / 0, (1,), 1.0, 0.5) is None
    row = {"S": 4096, "hd": 256, "causal": False, "dtype": "bfloat16", "specjax_tflops": 618.0,
           "cudnn_tflops": 599.0, "specjax_mhz": 1638, "specjax_watts": 633,
           "specjax_clock_events": "0x4", "cudnn_mhz": 1679, "cudnn_watts": 631, "cudnn_clock_events": "0x4"}
    bench_fa3._write([row], jax.devices()[0], str(tmp_path), "cmd", quiet=True, rounds=3, sustained=(1.5, 0.5))
    md, = tmp_path.glob("fa3_*.md")
    assert "sustained 1.5 s windows after 0.5 s untimed, median of 3 rounds" in md.read_text()
    assert "| bfloat16 | 256 | False | 4096 | 618 | 599 | 1.032 | 1638 / 633 | 1679 / 631 | 0x4 |" in md.read_text()
    assert json.loads(md.with_suffix(".json").read_text())["measure"].startswith("sustained")
    assert "rows, the run cut off" not in md.read_text()
    bench_fa3._write([row], jax.devices()[0], str(tmp_path), "cmd", quiet=True, planned=3)  # a run cut off
    assert "median of 1 timing rounds; 1 of 3 rows, the run cut off or still going" in md.read_text()
    assert json.loads(md.with_suffix(".json").read_text())["rows_planned"] == 3


def test_fa3_rows_option_picks_rows_of_the_table(capsys):
    import bench_fa3
    assert bench_fa3.parse_rows(None) is None
    assert bench_fa3.parse_rows("256:4096:c, 128:16384:n,256:4096:c") == [(256, 4096, True), (128, 16384, False)]
    assert bench_fa3.parse_rows("128:3000:n") == [(128, 3000, False)]  # any length: the power probe's rows too
    for bad in ("96:4096:n", "128:4096", "128:4096:x", "128:0:n"):
        with pytest.raises(ValueError, match=re.escape("--rows takes HD:S:c|n items")):
            bench_fa3.parse_rows(bad)
    for argv, outside in ((["--rows", "256:4000:c"], "256:4000:c"),    # checked before any GPU is needed
                          (["--quick", "--rows", "128:1024:n,64:1024:n"], "64:1024:n")):
        with pytest.raises(SystemExit) as e:
            bench_fa3.main(argv)
        assert e.value.code == 2
        assert f"--rows names rows outside the table chosen (S 512-16384 in powers of two; --quick: hd 128, S 1k and " \
               f"16k only): {outside}" in capsys.readouterr().err.replace("\n", " ")


@pytest.mark.assets
def test_draft_vocab_option_and_the_shipped_draft_vocabulary():
    """``draft`` loads the shipped draft model over the vocabulary shipped beside it (the shipped EAGLE-3 head's
    12288 tokens, as ``--draft-vocab LABEL=eagle3``), which still equals AR greedy (fp32) and gets drafts accepted;
    ``LABEL=full`` keeps the whole tied LM head."""
    from specjax import assets, pipeline
    from specjax.generate import generate
    from specjax.heads import shipped
    from specjax.speculative import DraftModel, drafters, speculative_generate
    if not (assets.home() / assets.MODELS["smollm2-135m-instruct"].dest).is_file():
        pytest.skip("SmolLM2 GGUF not fetched: run `specjax fetch`")
    if not all((SHIPPED / k / "config.json").is_file() for k in ("draft", "eagle3")):
        pytest.skip("needs the shipped draft model and EAGLE-3 head")
    lm = pipeline.load("smollm2-135m-instruct", "float32")
    drafter, dp = drafters.build("draft", lm.cfg, target_params=lm.params)
    cfg, cut = bench_speculative.shipped_draft_over(lm.cfg, lm.params, "eagle3")
    assert cut["lm_head"].shape == (12288, lm.cfg.d_model) and cfg == drafter.cfg
    assert (cut["vocab_ids"] == dp["vocab_ids"]).all() and (cut["lm_head"] == dp["lm_head"]).all()
    fcfg, full = bench_speculative.shipped_draft_over(lm.cfg, lm.params, "full")
    assert fcfg.tie_embeddings and "vocab_ids" not in full and "lm_head" not in full
    ids = [lm.encode("Write a Python function that reverses a string.", chat=True)]
    ref = generate(lm.params, lm.cfg, ids, max_new_tokens=24)
    out = speculative_generate(lm.params, lm.cfg, ids, DraftModel(cfg), cut, num_draft=3, max_new_tokens=24)
    assert out.output_ids == ref.output_ids and out.metrics()["mean_accepted"] > 1.0
    assert shipped.path("smollm2-135m-instruct", "draft").joinpath("draft_vocab.safetensors").is_file()
