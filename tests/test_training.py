"""Training on a tiny random target (CPU, fp32): TTT equals the decoding chain, losses drop, a killed
run resumes on the identical trajectory, data/corpus plumbing, and the whole train_smollm2 pipeline
(whose tau evaluation decodes with the trained EAGLE-3/Medusa heads and distilled draft model and
checks the output against AR greedy)."""

import dataclasses
import functools
import hashlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import cache as kv
from specjax import model
from specjax.errors import CheckpointError
from specjax.heads import eagle3, medusa, medusa_io, shipped
from training import cards, corpus, data, decontam, losses, recipes, teacher_cache, tiny
from training.eagle3_ttt import ttt_logits
from training.loop import TrainConfig, train


# Whole pipeline runs (corpus generation, training, the speculative loop's tau): on a CPU host XLA's optimized
# code pays for its compile time here (tests/conftest.py; 63.7 -> 76.0 s at level 0 for the two-device corpus).
PIPELINE = pytest.mark.execution_bound


@pytest.fixture(scope="module")
def target():
    return tiny.target()


@pytest.fixture(scope="module")
def dataset():
    rng = np.random.default_rng(0)
    examples = [(rng.integers(0, 256, rng.integers(4, 12)).tolist(),
                 rng.integers(0, 256, rng.integers(20, 50)).tolist()) for _ in range(24)]
    return data.pack_examples(examples, 64)


def test_ttt_unroll_equals_the_decoding_chain_row_by_row(target):
    cfg, tp = target
    ecfg = eagle3.Eagle3Config(cfg, draft_vocab_size=64)
    ids = jnp.arange(0, 256, 4, dtype=jnp.int32)
    hp = eagle3.init_params(ecfg, jax.random.key(1), tp, ids, scale=0.1)
    B, T, J = 2, 16, 4
    toks = jax.random.randint(jax.random.key(2), (B, T), 0, cfg.vocab_size)
    _, taps, _ = model.forward(tp, cfg, toks, taps=ecfg.taps)
    outs = jnp.stack(ttt_logits(hp, ecfg, tp["embed"], toks, taps, J), axis=1)  # [B, J, T, N]
    g = eagle3.fuse(hp, taps)

    @jax.jit
    def chain(t):  # decoding: rows 0..t with the target's features, then J-1 steps on the head's own outputs
        cache = eagle3.init_cache(ecfg, B, 2 * T)
        h, cache = eagle3.step(hp, ecfg, tp["embed"], toks[:, 1:], g[:, :-1], cache)
        h = jax.lax.dynamic_slice_in_dim(h, t, 1, axis=1)
        cache = kv.set_lengths(cache, jnp.full((B,), t + 1))
        out = []
        for j in range(J):
            out.append(eagle3.logits(hp, ecfg, h)[:, 0])
            tok = jax.lax.dynamic_slice_in_dim(toks, t + 2 + j, 1, axis=1)  # teacher-forced next token
            h, cache = eagle3.step(hp, ecfg, tp["embed"], tok, h, cache)
        return jnp.stack(out, axis=1)  # [B, J, N]

    for t in range(T - J - 1):
        np.testing.assert_allclose(chain(t), outs[:, :, t], rtol=2e-5, atol=2e-5)


def _eval_loss(loss_fn, params, frozen, batch):
    return float(jax.jit(loss_fn)(params, frozen, batch)[0])


@pytest.mark.parametrize("kind", ["eagle3", "medusa", "draft"])
def test_a_few_steps_lower_the_loss(target, dataset, kind):
    cfg, tp = target
    tc = TrainConfig(steps=12, batch_size=6, lr=3e-3, warmup_steps=2, progress=False)
    batch = {k: jnp.asarray(v) for k, v in dataset.batch(0, 12, seed=1).items()}
    if kind == "eagle3":
        ecfg, p1, ids, _ = recipes.train_eagle3(tp, cfg, dataset, tc, draft_vocab_size=64, ttt_steps=3)
        fn, frozen = functools.partial(losses.eagle3_loss, cfg=ecfg, num_steps=3), {"target": tp, "draft_ids": ids}
        p0 = eagle3.init_params(ecfg, jax.random.key(0), tp, ids)
    elif kind == "medusa":
        mcfg, p1, _ = recipes.train_medusa(tp, cfg, dataset, tc, num_heads=3)
        fn, frozen, p0 = functools.partial(losses.medusa_loss, cfg=mcfg), {"target": tp}, medusa.init_params(mcfg)
    else:
        dcfg, full, _ = recipes.train_draft(tp, cfg, dataset, tc, n_layers=2)
        p1 = {k: full[k] for k in ("layers", "final_norm")}
        p0 = recipes.init_draft(tp, cfg, 2)[1]
        fn = functools.partial(losses.distill_loss, cfg=dcfg, target_cfg=cfg)
        frozen = {"target": tp, "shared": recipes.shared_of(tp, cfg)}
    before, after = _eval_loss(fn, p0, frozen, batch), _eval_loss(fn, p1, frozen, batch)
    assert after < before, (kind, before, after)


def test_teacher_cache_rows_are_the_weighted_positions_in_row_major_order():
    w = np.array([[0, 1, 1, 0], [0, 0, 0, 0], [1, 0, 1, 1]], np.uint8)
    np.testing.assert_array_equal(teacher_cache.flat_positions(w), [[0, 0, 1, 0], [0, 0, 0, 0], [2, 0, 3, 4]])
    ds = teacher_cache.Indexed(data.TokenDataset(np.arange(12, dtype=np.int32).reshape(3, 4), w))
    b = ds.take(np.array([2, 0]))
    np.testing.assert_array_equal(b["t_index"], [[2, 0, 3, 4], [0, 0, 1, 0]])
    np.testing.assert_array_equal(b["tokens"], [[8, 9, 10, 11], [0, 1, 2, 3]])
    assert len(ds) == 3 and ds.seq_len == 4
    with pytest.raises(ValueError, match="no weighted positions"):
        teacher_cache.build({"embed": jnp.zeros((4, 2))}, tiny.target()[0], data.TokenDataset(w * 0, w * 0))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cached_teacher_logits_equal_the_target_forward(target, dataset, dtype):
    cfg, tp = target
    tp = jax.tree.map(lambda x: x.astype(dtype), tp)
    # float32: batches of 5 rows (the last of 4 padded); bfloat16: the one batch the reference runs, jitted as
    # in a train step (a bf16 forward over another batch shape, or eager, may round differently)
    h_PD = teacher_cache.build(tp, cfg, dataset, batch_rows=5 if dtype == "float32" else len(dataset))
    assert h_PD.shape == (int((dataset.weight_NT > 0).sum()), cfg.d_model) and h_PD.dtype == jnp.dtype(dtype)
    b = teacher_cache.Indexed(dataset).take(slice(0, 24))
    got = jax.jit(teacher_cache.teacher_logits, static_argnums=1)(tp, cfg, h_PD, jnp.asarray(b["t_index"]))
    want, _ = jax.jit(losses.teacher, static_argnums=1)(tp, cfg, jnp.asarray(b["tokens"]))
    keep = b["weight"] > 0
    if dtype == "float32":
        np.testing.assert_allclose(np.asarray(got)[keep], np.asarray(want)[keep], rtol=1e-5, atol=1e-5)
    else:  # the hidden state rounded to bf16 where the LM head would round it: the same bits
        np.testing.assert_array_equal(np.asarray(got)[keep], np.asarray(want)[keep])


def test_draft_distilled_from_the_cached_teacher_follows_the_uncached_run(target, dataset, tmp_path):
    cfg, tp = target
    train_ds, held = dataset.split(4, seed=0)
    tc = TrainConfig(steps=6, batch_size=4, lr=3e-3, warmup_steps=2, progress=False)
    _, p_plain, r_plain = recipes.train_draft(tp, cfg, train_ds, tc, heldout=held)
    _, p_cached, r_cached = recipes.train_draft(tp, cfg, train_ds, tc, heldout=held, cache_teacher=True)
    np.testing.assert_allclose([h["loss"] for h in r_cached.history], [h["loss"] for h in r_plain.history],
                               rtol=1e-5)
    assert r_plain.history[-1]["loss"] < r_plain.history[0]["loss"]
    for a, b in zip(jax.tree.leaves(p_cached), jax.tree.leaves(p_plain)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    # the held-out rows run the target in both
    np.testing.assert_allclose(r_cached.heldout["loss"], r_plain.heldout["loss"], rtol=1e-5)
    dcfg, p0 = recipes.init_draft(tp, cfg, 2)
    fn = functools.partial(losses.distill_loss, cfg=dcfg, target_cfg=cfg)

    def run(ckpt_dir, **kw):  # each run builds its cache afresh, as a resumed process does
        frozen = {"target": tp, "shared": recipes.shared_of(tp, cfg),
                  "t_hidden": teacher_cache.build(tp, cfg, train_ds)}
        ck = dataclasses.replace(tc, ckpt_dir=str(ckpt_dir), ckpt_every=2)
        return train(fn, p0, frozen, teacher_cache.Indexed(train_ds), ck, **kw)
    full = run(tmp_path / "full")
    assert [h["loss"] for h in full.history] == [h["loss"] for h in r_cached.history]
    run(tmp_path / "cut", stop_after=3)  # checkpoint at 2, "killed" after 3
    resumed = run(tmp_path / "cut")
    assert resumed.start_step == 2 and resumed.end_step == 6
    assert [h["loss"] for h in full.history[2:]] == [h["loss"] for h in resumed.history]


def test_eagle3_fine_tunes_from_an_exported_head(target, dataset, tmp_path):
    """``train_eagle3(init=...)`` (``--init`` / ``--init-eagle3``) starts from the exported head: with lr 0
    (1e-12: it must be positive) the result is that head, draft vocabulary included; a few steps from it
    lower its loss; a head of
    another draft vocabulary is refused."""
    from specjax.heads import eagle3_io
    cfg, tp = target
    tc = TrainConfig(steps=6, batch_size=6, lr=3e-3, warmup_steps=2, progress=False)
    ecfg, p1, ids, _ = recipes.train_eagle3(tp, cfg, dataset, tc, draft_vocab_size=64, ttt_steps=3)
    eagle3_io.save_eagle3(tmp_path / "head", p1, ecfg, ids)
    init = eagle3_io.load_eagle3(tmp_path / "head", target=cfg)
    _, same, ids0, _ = recipes.train_eagle3(tp, cfg, dataset, dataclasses.replace(tc, lr=1e-12), draft_vocab_size=64,
                                            ttt_steps=3, init=init)
    np.testing.assert_array_equal(ids0, ids)
    for k in init[1]:
        np.testing.assert_allclose(np.asarray(same[k]), np.asarray(init[1][k], np.float32), rtol=0, atol=1e-9,
                                   err_msg=k)
    _, p2, _, _ = recipes.train_eagle3(tp, cfg, dataset, tc, draft_vocab_size=64, ttt_steps=3, init=init)
    fn, frozen = functools.partial(losses.eagle3_loss, cfg=ecfg, num_steps=3), {"target": tp, "draft_ids": ids}
    batch = {k: jnp.asarray(v) for k, v in dataset.batch(0, 12, seed=1).items()}
    assert _eval_loss(fn, p2, frozen, batch) < _eval_loss(fn, same, frozen, batch)
    with pytest.raises(ValueError, match="draft vocabulary 64"):
        recipes.train_eagle3(tp, cfg, dataset, tc, draft_vocab_size=32, ttt_steps=3, init=init)


def test_draft_model_fine_tunes_from_an_exported_model(target, dataset, tmp_path):
    """``train_draft(init=...)`` (``--init`` / ``--init-draft``) starts from a saved draft model: with lr 0 (1e-12)
    the result is that model; a few steps from it lower its loss; another depth or a cut LM head is refused."""
    from specjax.heads import draft_io
    cfg, tp = target
    tc = TrainConfig(steps=6, batch_size=6, lr=3e-3, warmup_steps=2, progress=False)
    dcfg, full, _ = recipes.train_draft(tp, cfg, dataset, tc, n_layers=2)
    draft_io.save_draft_model(tmp_path / "d", full, dcfg, shared_embedding=True, vocab_ids=np.arange(0, 256, 2))
    init = draft_io.load_draft_model(tmp_path / "d", tp, jnp.float32, full_vocab=True)
    _, same, _ = recipes.train_draft(tp, cfg, dataset, dataclasses.replace(tc, lr=1e-12), n_layers=2, init=init)
    for k in ("layers", "final_norm"):
        jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-9),
                     same[k], init[1][k])
    _, p2, _ = recipes.train_draft(tp, cfg, dataset, tc, n_layers=2, init=init)
    fn = functools.partial(losses.distill_loss, cfg=dcfg, target_cfg=cfg)
    frozen = {"target": tp, "shared": recipes.shared_of(tp, cfg)}
    batch = {k: jnp.asarray(v) for k, v in dataset.batch(0, 12, seed=1).items()}
    trained = lambda p: {k: p[k] for k in ("layers", "final_norm")}  # noqa: E731
    assert _eval_loss(fn, trained(p2), frozen, batch) < _eval_loss(fn, trained(same), frozen, batch)
    with pytest.raises(ValueError, match="has 2 layers"):
        recipes.train_draft(tp, cfg, dataset, tc, n_layers=1, init=init)
    with pytest.raises(ValueError, match="a cut LM head"):
        recipes.train_draft(tp, cfg, dataset, tc, n_layers=2, init=draft_io.load_draft_model(tmp_path / "d", tp))


@PIPELINE
@pytest.mark.parametrize("tied", [False, True])
def test_train_smollm2_fine_tunes_the_draft_model(dataset, tmp_path, monkeypatch, tied):
    """``--init-draft FOLDER``: the draft stage starts from that model, its record and card say so, and its draft
    vocabulary is exported with the result, in the slim folder and the Hugging Face one (so the fine-tune decodes over
    the same cut head). ``tied``: a target with tied embeddings, as SmolLM2 (the cut head comes back untied; its tau
    check once failed on the device)."""
    from specjax.heads import draft_io
    from training import train_smollm2
    if tied:
        untied_config = tiny.target_config
        monkeypatch.setattr(tiny, "target_config", lambda *a, **kw: dataclasses.replace(
            untied_config(*a, **kw), tie_embeddings=True))
    cfg, tp = tiny.target()
    assert cfg.tie_embeddings == tied and ("lm_head" in tp) != tied
    tc = TrainConfig(steps=2, batch_size=4, lr=3e-3, warmup_steps=1, progress=False)
    dcfg, full, _ = recipes.train_draft(tp, cfg, dataset, tc, n_layers=2)
    ids = np.arange(1, 256, 3)
    draft_io.save_draft_model(tmp_path / "d", full, dcfg, shared_embedding=True, vocab_ids=ids)
    argv = ["--preset", "cpu-tiny", "--out", str(tmp_path / "run"), "--only", "draft", "--init-draft", str(tmp_path / "d")]
    assert train_smollm2.main(argv) == 0
    rec = json.loads((tmp_path / "run" / "results.json").read_text())["artifacts"]["draft"]
    sha = hashlib.sha256((tmp_path / "d" / "model.safetensors").read_bytes()).hexdigest()
    assert rec["init_from"] == str((tmp_path / "d").resolve()) and rec["init_sha256"] == sha
    assert rec["tau"]["greedy_equals_ar"] is True
    export = tmp_path / "run" / "export" / "draft"
    assert f"Fine-tuned from the model in `{(tmp_path / 'd').resolve()}` (model.safetensors sha256 {sha};" in (
        export / "CARD.md").read_text()
    np.testing.assert_array_equal(draft_io.draft_vocab_of(export), ids)
    np.testing.assert_array_equal(draft_io.draft_vocab_of(tmp_path / "run" / "export" / "draft-hf"), ids)


def _medusa_run(target, dataset, ckpt_dir, **kw):
    cfg, tp = target
    mcfg = medusa.MedusaConfig(cfg, num_heads=2)
    tc = TrainConfig(steps=8, batch_size=4, lr=3e-3, warmup_steps=2, progress=False, ckpt_dir=ckpt_dir, ckpt_every=3)
    return train(functools.partial(losses.medusa_loss, cfg=mcfg), medusa.init_params(mcfg), {"target": tp}, dataset,
                 tc, **kw)


def test_interrupted_run_resumes_on_the_identical_loss_trajectory(target, dataset, tmp_path):
    full = _medusa_run(target, dataset, str(tmp_path / "a"))
    crashed = _medusa_run(target, dataset, str(tmp_path / "b"), stop_after=5)  # checkpoint at 3, crash after 5
    resumed = _medusa_run(target, dataset, str(tmp_path / "b"))
    assert [h["step"] for h in crashed.history] == [1, 2, 3, 4, 5] and resumed.start_step == 3
    assert [h["loss"] for h in full.history[:5]] == [h["loss"] for h in crashed.history]
    assert [h["loss"] for h in full.history[3:]] == [h["loss"] for h in resumed.history]
    for a, b in zip(jax.tree.leaves(full.params), jax.tree.leaves(resumed.params)):
        assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="data seed"):  # resuming with another data order is refused
        cfg, tp = target
        mcfg = medusa.MedusaConfig(cfg, num_heads=2)
        tc = TrainConfig(steps=8, batch_size=4, seed=7, progress=False, ckpt_dir=str(tmp_path / "b"))
        train(functools.partial(losses.medusa_loss, cfg=mcfg), medusa.init_params(mcfg), {"target": tp}, dataset, tc)


def test_sigkilled_process_resumes_on_the_identical_loss_trajectory(tmp_path):
    script = textwrap.dedent("""
        import functools, json, os, signal, sys
        import numpy as np
        from specjax.heads import medusa
        from training import data, losses, tiny
        from training.loop import TrainConfig, train
        cfg, tp = tiny.target()
        rng = np.random.default_rng(0)
        ds = data.pack_examples([(rng.integers(0, 256, 6).tolist(), rng.integers(0, 256, 30).tolist())
                                 for _ in range(16)], 48)
        mcfg = medusa.MedusaConfig(cfg, num_heads=2)
        tc = TrainConfig(steps=7, batch_size=4, lr=3e-3, warmup_steps=2, progress=False, ckpt_dir=sys.argv[1],
                         ckpt_every=2)
        kill_at = int(sys.argv[2])
        def log(rec):
            print(json.dumps(rec), flush=True)
            if rec["step"] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        train(functools.partial(losses.medusa_loss, cfg=mcfg), medusa.init_params(mcfg), {"target": tp}, ds, tc,
              callback=log)
    """)
    path = tmp_path / "run.py"
    path.write_text(script)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    def losses_of(ckpt, kill_at):
        p = subprocess.run([sys.executable, str(path), str(tmp_path / ckpt), str(kill_at)], capture_output=True,
                           text=True, env=env)
        recs = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        return p.returncode, {r["step"]: r["loss"] for r in recs}

    rc_full, full = losses_of("full", -1)
    rc_killed, first = losses_of("killed", 5)  # checkpoints at 2 and 4; killed by SIGKILL after step 5
    rc_resumed, second = losses_of("killed", -1)
    assert rc_full == 0 and rc_killed == -9 and rc_resumed == 0
    assert sorted(first) == [1, 2, 3, 4, 5] and sorted(second) == [5, 6, 7]
    assert {**first, **second} == full


def test_data_parallel_training_follows_the_one_device_trajectory(tmp_path):
    """Two (forced host) devices: the batch is split along its rows, the state stays replicated, and
    the losses and params match the one-device run's up to float summation order; a run killed after
    step 5 and resumed on two devices continues it exactly; a batch that does not split is refused."""
    script = textwrap.dedent("""
        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
        import functools, json, sys
        import jax, numpy as np
        from specjax.heads import medusa
        from training import data, losses, tiny
        from training.loop import TrainConfig, train
        assert jax.device_count() == 2, jax.devices()
        cfg, tp = tiny.target()
        rng = np.random.default_rng(0)
        ds = data.pack_examples([(rng.integers(0, 256, 6).tolist(), rng.integers(0, 256, 30).tolist())
                                 for _ in range(16)], 48)
        mcfg = medusa.MedusaConfig(cfg, num_heads=2)
        def run(n, tc=(), **kw):
            tc = TrainConfig(**{**dict(steps=7, batch_size=4, lr=3e-3, warmup_steps=2, progress=False, devices=n),
                                **dict(tc)})
            return train(functools.partial(losses.medusa_loss, cfg=mcfg), medusa.init_params(mcfg), {"target": tp},
                         ds, tc, **kw)
        one, two = run(1), run(2)
        shardings = {str(x.sharding.device_set == set(jax.devices())) for x in jax.tree.leaves(two.params)}
        ckpt = dict(ckpt_dir=sys.argv[1], ckpt_every=2)
        killed = run(2, tc=ckpt, stop_after=5)
        resumed = run(2, tc=ckpt)
        try:
            run(2, tc=dict(batch_size=3))
            refused = ""
        except ValueError as e:
            refused = str(e)
        diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                   for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(two.params)))
        print(json.dumps({"one": [h["loss"] for h in one.history], "two": [h["loss"] for h in two.history],
                          "killed": [h["loss"] for h in killed.history], "resumed": [h["loss"] for h in resumed.history],
                          "start": resumed.start_step, "param_diff": diff, "replicated": sorted(shardings),
                          "refused": refused}))
    """)
    path = tmp_path / "dp.py"
    path.write_text(script)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.run([sys.executable, str(path), str(tmp_path / "ckpt")], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.splitlines()[-1])
    assert r["replicated"] == ["True"]
    np.testing.assert_allclose(r["two"], r["one"], rtol=1e-5)
    assert 0 < len(set(r["one"])) and r["param_diff"] < 1e-5
    assert r["start"] == 4 and r["killed"] == r["two"][:5] and r["resumed"] == r["two"][4:]
    assert "divisible by 2" in r["refused"]


@PIPELINE
def test_corpus_built_on_two_devices_is_the_one_device_corpus(tmp_path):
    """Two (forced host) devices generate the Magpie rounds and the response pieces at once (training/pool.py):
    both devices answer pieces, and the Magpie queries and the packed corpus equal a one-device build's
    (greedy and sampled: each piece keeps its seed); a pool of more devices than there are is refused."""
    script = textwrap.dedent("""
        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
        import json, sys
        import jax, numpy as np
        from training import corpus, tiny
        from training.make_corpus import CorpusSpec, build_corpus
        from training.pool import DevicePool
        assert jax.device_count() == 2, jax.devices()
        cfg, tp = tiny.target()
        tok = tiny.tokenizer()
        spec = CorpusSpec(n_chat=3, n_code=10, n_code_raw=3, temperatures=(0.0, 0.7), max_new_tokens=8,
                          max_prompt_tokens=320, seq_len=352, gen_batch=2, magpie_max_new=16)
        used, real = [], corpus.generate
        def recording(params, cfg, prompts, **kw):
            used.append(("magpie" if "top_p" in kw else "answer", str(jax.tree.leaves(params)[0].device)))
            return real(params, cfg, prompts, **kw)
        corpus.generate = recording
        quiet = lambda msg: None
        out = {}
        for n in (1, 2):
            used.clear()
            ds, manifest = build_corpus(tp, cfg, tok, spec, f"{sys.argv[1]}/d{n}", None, log=quiet, devices=n)
            queries = json.load(open(f"{sys.argv[1]}/d{n}/parts/magpie.json"))["texts"]
            out[n] = {"tokens": ds.tokens_NT.tolist(), "weight": ds.weight_NT.tolist(), "queries": queries,
                      "devices": manifest["meta"]["devices"], "pieces": manifest["meta"]["pieces"]["made"],
                      "used": sorted(set(used))}
        try:
            DevicePool(tp, 3)
            out["refused"] = ""
        except ValueError as e:
            out["refused"] = str(e)
        pool = DevicePool({"x": np.zeros(2)}, 2)
        out["order"] = pool.map(lambda p, i: (i, str(p["x"].device)), range(6))
        def bad(p, i):
            if i == 2:
                raise KeyError("job 2 failed")
            return i
        try:
            pool.map(bad, range(6))
            out["raised"] = ""
        except KeyError as e:
            out["raised"] = str(e)
        print(json.dumps(out))
    """)
    path = tmp_path / "pool.py"
    path.write_text(script)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.run([sys.executable, str(path), str(tmp_path)], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.splitlines()[-1])
    one, two = r["1"], r["2"]
    assert one["devices"] == 1 and two["devices"] == 2 and one["pieces"] == two["pieces"] >= 5
    assert one["used"] == [["answer", "cpu:0"], ["magpie", "cpu:0"]]
    assert two["used"] == [[k, f"cpu:{d}"] for k in ("answer", "magpie") for d in (0, 1)]
    assert len(one["queries"]) >= 1 and two["queries"] == one["queries"]  # (the tiny target ends few in time)
    assert len(one["tokens"]) > 20 and two["tokens"] == one["tokens"] and two["weight"] == one["weight"]
    assert "needs 1 to 2" in r["refused"]
    assert [i for i, _ in r["order"]] == list(range(6)) and {d for _, d in r["order"]} <= {"cpu:0", "cpu:1"}
    assert "job 2 failed" in r["raised"]  # a job's error reaches the caller


def test_data_shards_batches_and_draft_vocab(tmp_path, dataset):
    data.write_shards(tmp_path, dataset, shard_rows=10, meta={"note": "x"})
    back, manifest = data.load_shards(tmp_path)
    assert len(manifest["shards"]) == 3 and manifest["meta"] == {"note": "x"}
    assert np.array_equal(back.tokens_NT, dataset.tokens_NT) and np.array_equal(back.weight_NT, dataset.weight_NT)
    seen = np.concatenate([dataset.indices(s, 6, seed=3) for s in range(4)])  # one epoch = 4 batches of 6
    assert sorted(seen.tolist()) == list(range(24))
    assert np.array_equal(dataset.indices(5, 6, seed=3), dataset.indices(5, 6, seed=3))
    assert not np.array_equal(dataset.indices(4, 6, seed=3), dataset.indices(0, 6, seed=3))  # new epoch, new order
    train_ds, held = dataset.split(5, seed=1)  # a random subset, not the tail; rows stay whole and disjoint
    rows = lambda d: {tuple(r) for r in np.concatenate([d.tokens_NT, d.weight_NT], 1).tolist()}
    assert len(train_ds) == 19 and len(held) == 5 and rows(train_ds) | rows(held) == rows(dataset)
    assert not rows(train_ds) & rows(held) and rows(held) != rows(dataset.split(5)[1])
    ds = data.pack_examples([([1, 2, 3], [4, 5, 6, 7])], 6)
    assert ds.tokens_NT.tolist() == [[1, 2, 3, 4, 5, 6]] and ds.weight_NT.tolist() == [[0, 0, 1, 1, 1, 0]]
    counts = np.array([5, 0, 9, 9, 1])
    assert data.draft_vocab(counts, 3).tolist() == [0, 2, 3]
    (tmp_path / "shard_00001.npz").write_bytes(b"corrupt")
    with pytest.raises(CheckpointError, match="sha256"):
        data.load_shards(tmp_path)


def test_split_by_prompt_keeps_every_answer_of_a_prompt_on_one_side():
    rng = np.random.default_rng(1)
    prompts = [rng.integers(1, 256, rng.integers(4, 12)).tolist() for _ in range(10)]
    # every prompt answered twice (two temperatures), as in the corpus; one prompt a prefix of another's row
    examples = [(p, rng.integers(1, 256, 20).tolist()) for p in prompts for _ in range(2)]
    examples.append((prompts[0] + examples[0][1][:3], rng.integers(1, 256, 10).tolist()))
    ds = data.pack_examples(examples, 48)
    train_ds, held = ds.split(5, seed=3, by_prompt=True)
    keys = lambda d: d.prompt_keys()
    assert len(train_ds) + len(held) == len(ds) and len(held) >= 5
    assert not set(keys(train_ds)) & set(keys(held))  # no held-out prompt is trained on
    assert len(set(keys(ds))) == 11 and sorted(keys(train_ds) + keys(held)) == sorted(keys(ds))
    row_split = ds.split(6, seed=3)[1]  # a random row split shares prompts with training here
    assert set(keys(row_split)) & set(keys(ds.split(6, seed=3)[0]))
    with pytest.raises(ValueError, match="needs a seed"):
        ds.split(5, by_prompt=True)


def test_eval_overlap_is_filtered_and_asserted():
    evals = ["Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences "
             "and must-see attractions.", "def has_close_elements(numbers, threshold):"]
    index = decontam.OverlapIndex(evals)
    texts = ["Please compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural "
             "experiences and more.", "Write about Hawaii.", "def has_close_elements(numbers, threshold): pass"]
    kept, dropped = decontam.filter_overlap(texts, index)
    assert kept == [1] and dropped == [0, 2]
    decontam.assert_no_overlap([texts[1]], index)
    with pytest.raises(AssertionError, match="MT-bench/HumanEval"):
        decontam.assert_no_overlap(texts, index)


def test_overlap_lookup_by_first_words_equals_the_definition():
    """``OverlapIndex.overlaps`` (windows looked up by their first two words) answers as the plain definition
    does, on texts with and without planted eval n-grams, with eval texts of 1, 2, 5 and >= n words."""
    import random
    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(40)]  # a small vocabulary: many windows start like a gram
    evals = ["w1", "w2 w3", "w4 w5 w6 w7 w8"] + [" ".join(rng.choices(vocab, k=30)) for _ in range(20)]
    index = decontam.OverlapIndex(evals, n=6)
    assert set(index.grams) == {1, 2, 5, 6}
    texts = []
    for i in range(600):
        w = rng.choices(vocab[5:], k=rng.randrange(0, 40))
        if i % 3 == 0:  # plant a gram of one of the eval texts
            e = decontam.words(rng.choice(evals))
            k = min(6, len(e))
            a = rng.randrange(len(e) - k + 1)
            j = rng.randrange(len(w) + 1)
            w[j:j] = e[a:a + k - (i % 2)]  # every other plant one word short: no overlap unless by chance
        texts.append(" ".join(w).upper() if i % 5 == 0 else " ".join(w))
    got, want = [index.overlaps(t) for t in texts], [index.overlaps_naive(t) for t in texts]
    assert got == want and 50 < sum(want) < 550


def test_corpus_prompts_come_from_the_template_and_the_stdlib():
    tok = tiny.tokenizer()
    assert corpus.user_turn_prefix(tok) == "<|im_start|>user\n"
    code = corpus.code_prompts(5, seed=0)
    assert code == corpus.code_prompts(5, seed=0) and len(set(code)) == 5
    for p in code:
        src = p.split("```python\n", 1)[1].rsplit("```", 1)[0]
        compile(src, "<stub>", "exec")  # a valid signature + docstring stub
    raw = corpus.code_completions(5, seed=0)
    assert len(set(raw)) == 5 and all(r.endswith('"""\n') for r in raw)
    pool = corpus.code_pool(packages=("optax",))  # a dependency's functions join the stdlib's
    assert len(pool) > len(corpus.code_pool()) and set(corpus.code_pool()) <= set(pool)
    for f in pool[len(corpus.code_pool()):][:20]:
        compile(f, "<stub>", "exec")
    with pytest.raises(ValueError, match="not installed"):
        corpus.code_pool(packages=("no_such_package_xyz",))
    for r in raw:  # plain text a model continues: indented like hand-written code, and valid Python
        compile(r, "<stub>", "exec")
        assert re.search(r'^( *)def .*\n\1    """', r, re.M), r  # docstring one level below its def


def test_magpie_openers_start_every_sampled_query(target):
    cfg, tp = target
    tok = tiny.tokenizer()
    openers = ("Write a", "List")
    qs = corpus.magpie_prompts(tp, cfg, tok, 3, max_new_tokens=32, batch_size=16, seed=0, openers=openers)
    assert len(qs) == 3 and all(q.startswith(openers) and len(q) > len("Write a") for q in qs), qs
    assert qs == corpus.magpie_prompts(tp, cfg, tok, 3, max_new_tokens=32, batch_size=16, seed=0, openers=openers)


def test_a_cut_off_corpus_build_resumes_from_its_pieces_to_the_same_corpus(target, tmp_path, monkeypatch):
    """A build killed after some pieces (a device call's time limit) reruns generating only the rest, and ends with
    the corpus an uninterrupted build makes; pieces of another spec are not reused."""
    from training import parts
    from training.make_corpus import CorpusSpec, build_corpus
    cfg, tp = target
    tok = tiny.tokenizer()
    spec = CorpusSpec(n_chat=1, n_code=10, n_code_raw=3, temperatures=(0.0, 0.7), max_new_tokens=8,
                      max_prompt_tokens=320, seq_len=352, gen_batch=2, magpie_max_new=16)
    # per temperature: 10 chat prompts (one code prompt is too long) -> pieces of 8 and 2 rows (batches 0-3 and 4),
    # 3 raw stubs -> one piece
    assert spec.gen_batch * parts.PART_BATCHES == 8
    quiet = lambda msg: None  # noqa: E731
    whole, _ = build_corpus(tp, cfg, tok, spec, tmp_path / "whole", None, log=quiet)

    real, calls, armed = corpus.respond_ids, [], [True]

    def dies_on_third_piece(*args, **kwargs):
        calls.append(kwargs["first_batch"])
        if len(calls) == 3 and armed:
            armed.clear()
            raise TimeoutError("the call's time limit")
        return real(*args, **kwargs)
    monkeypatch.setattr(corpus, "respond_ids", dies_on_third_piece)
    with pytest.raises(TimeoutError):
        build_corpus(tp, cfg, tok, spec, tmp_path / "cut", None, log=quiet)
    assert calls == [0, 4, 0] and not (tmp_path / "cut" / "manifest.json").exists()
    assert len(list((tmp_path / "cut" / "parts").glob("*.npz"))) == 2  # no half-written third piece

    calls.clear()
    resumed, manifest = build_corpus(tp, cfg, tok, spec, tmp_path / "cut", None, log=quiet)
    assert calls == [0, 0, 4, 0] and len(resumed) == len(whole) == 26  # (10 + 3) prompts x 2 temperatures
    np.testing.assert_array_equal(resumed.tokens_NT, whole.tokens_NT)
    np.testing.assert_array_equal(resumed.weight_NT, whole.weight_NT)
    assert manifest["meta"]["pieces"] == {"made": 4, "reused": 3}  # the Magpie query and two response pieces

    calls.clear()  # another spec: the old pieces are deleted, everything is generated anew
    build_corpus(tp, cfg, tok, dataclasses.replace(spec, max_new_tokens=7), tmp_path / "cut", None, log=quiet)
    assert calls == [0, 4, 0, 0, 4, 0]


def test_fixed_width_corpus_runs_one_program_per_temperature_with_the_same_greedy_answers(target, tmp_path,
                                                                                         monkeypatch):
    """``CorpusSpec(fixed_width=True)``: every response batch has one (prompt width, cache capacity, rows) shape
    per temperature, where the default spec compiles one per prompt-width bucket and row count; the greedy
    answers are those of the default spec; a spec without the field's default still writes the old JSON."""
    from specjax.generate import bucket_shapes
    from training.make_corpus import CorpusSpec, build_corpus
    cfg, tp = target
    tok = tiny.tokenizer()
    spec = CorpusSpec(n_chat=1, n_code=10, n_code_raw=3, temperatures=(0.0, 0.7), max_new_tokens=8,
                      max_prompt_tokens=320, seq_len=352, gen_batch=4, magpie_max_new=16)
    assert "fixed_width" not in spec.to_json() and dataclasses.replace(spec, fixed_width=True).to_json()["fixed_width"]
    shapes = []

    def recording(params, cfg, prompts, **kw):
        if "top_p" not in kw:  # response batches (the Magpie queries are sampled with top-p)
            shapes.append((kw["temperature"], len(prompts), bucket_shapes(prompts, kw["max_new_tokens"],
                                                                          kw.get("pad_to", 0))))
        return real(params, cfg, prompts, **kw)
    real = corpus.generate
    monkeypatch.setattr(corpus, "generate", recording)
    quiet = lambda msg: None  # noqa: E731
    default, _ = build_corpus(tp, cfg, tok, spec, tmp_path / "default", None, log=quiet)
    default_shapes, shapes[:] = set(shapes), []
    fixed, _ = build_corpus(tp, cfg, tok, dataclasses.replace(spec, fixed_width=True), tmp_path / "fixed", None,
                            log=quiet)
    assert len({s for s in default_shapes if s[0] == 0.0}) > 1          # several programs per temperature ...
    assert len({s for s in shapes if s[0] == 0.0}) == len({s for s in shapes if s[0] == 0.7}) == 1   # ... and one
    greedy = lambda ds: sorted(map(tuple, ds.tokens_NT[:len(ds) // 2]))  # noqa: E731
    assert len(fixed) == len(default) and greedy(fixed) == greedy(default)


def test_templated_instructions_are_distinct_reproducible_and_varied():
    from training import instructions
    a = instructions.instructions(500, seed=1)
    assert a == instructions.instructions(500, seed=1) and len(set(a)) == 500
    assert a != instructions.instructions(500, seed=2)
    assert len({t.split()[0] for t in a}) >= 15  # many request kinds, not one template


def test_a_resumed_stage_keeps_its_earlier_training_record():
    from training.loop import TrainResult
    from training.train_smollm2 import continued_record
    prev = {"steps": 3, "train_seconds": 10.0, "final": {"step": 3}, "history": [{"step": s} for s in (1, 2, 3)]}
    more = TrainResult(params={}, history=[{"step": s} for s in (4, 5, 6)], start_step=3, end_step=6)
    rec = continued_record(prev, more, 5.0)
    assert rec["train_seconds"] == 15.0 and rec["final"] == {"step": 6} and [h["step"] for h in rec["history"]] == [
        1, 2, 3, 4, 5, 6]
    done = TrainResult(params={}, history=[], start_step=3, end_step=3)  # complete already: 0 steps run
    assert continued_record(prev, done, 2.5) == {"train_seconds": 10.0, "final": {"step": 3}, "history": prev["history"]}
    assert continued_record(prev, TrainResult({}, [], 0, 6), 5.0) == {}
    # The earlier invocation died before writing its record (session 58's first call): the time covers steps 4-6 only.
    orphan = {"steps": 6, "batch_size": 1000, "seq_len": 10, "train_seconds": 6.0} | continued_record(None, more, 6.0)
    assert orphan["resumed_from_step"] == 3
    assert cards._throughput(orphan).startswith(" (5k token positions/s")  # 3 steps x 1000 x 10 / 6 s
    assert cards._resumed(orphan).startswith(" for steps 4-6 (resumed from the checkpoint at step 3;")


@PIPELINE
def test_train_smollm2_script_runs_end_to_end_on_a_tiny_target(tmp_path):
    """Corpus -> EAGLE-3, Medusa, distilled draft -> export -> tau through the speculative loop (whose greedy
    output must equal AR greedy, in fp32, for all three, decoding from the exported files) -> cards, bundle."""
    from training import train_smollm2
    argv = ["--preset", "cpu-tiny", "--out", str(tmp_path / "run"), "--bundle", str(tmp_path / "b")]
    assert train_smollm2.main(argv) == 0
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    for kind in ("eagle3", "medusa", "draft"):
        art = res["artifacts"][kind]
        assert art["tau"]["greedy_equals_ar"] is True, kind
        assert art["tau"]["all"]["num_cycles"] > 0 and 1.0 <= art["tau"]["all"]["mean_accepted"] <= 4.0
        assert art["steps"] == 6 and len(art["history"]) == 6
        held = art["heldout"]  # scored on corpus rows the stage never trained on
        assert held["rows"] == 4 and np.isfinite(held["loss"]) and all(0 <= a <= 1 for a in held["acc_k"])
        card = (tmp_path / "run" / "export" / kind / "CARD.md").read_text()
        assert "tau" in card and "token positions/s" in card  # the issue asks for training throughput
        assert art["command"] == shlex.join(["python3", "-m", "training.train_smollm2", *argv])
        assert f"Command: `{art['command']}`" in card  # a card says how to remake its artifact
    assert res["corpus"]["num_examples"] > 0 and res["corpus"]["eval_overlap"]["dropped_examples"] >= 0
    parts = sorted((tmp_path / "b").glob("shipped.tar.part*"))
    with tarfile.open(fileobj=io.BytesIO(b"".join(p.read_bytes() for p in parts))) as tar:
        names = tar.getnames()
    assert {"eagle3/model.safetensors", "medusa/medusa_lm_head.safetensors", "draft/model.safetensors",
            "results.json"} <= set(names)


@PIPELINE
def test_train_smollm2_fine_tunes_a_head_on_a_new_corpus(target, dataset, tmp_path):
    """``--init-eagle3 FOLDER --corpus-seed N``: the EAGLE-3 stage starts from that head on a corpus of
    another seed, and its record and card say so."""
    from specjax.heads import eagle3_io
    from training import train_smollm2
    cfg, tp = target
    tc = TrainConfig(steps=2, batch_size=4, lr=3e-3, warmup_steps=1, progress=False)
    ecfg, p1, ids, _ = recipes.train_eagle3(tp, cfg, dataset, tc, draft_vocab_size=64, ttt_steps=3)
    eagle3_io.save_eagle3(tmp_path / "head", p1, ecfg, ids)
    argv = ["--preset", "cpu-tiny", "--out", str(tmp_path / "run"), "--only", "eagle3", "--corpus-seed", "7",
            "--init-eagle3", str(tmp_path / "head")]
    assert train_smollm2.main(argv) == 0
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    rec = res["artifacts"]["eagle3"]
    sha = hashlib.sha256((tmp_path / "head" / "model.safetensors").read_bytes()).hexdigest()
    assert res["preset"]["corpus"]["seed"] == 7 and rec["init_from"] == str((tmp_path / "head").resolve())
    assert rec["init_sha256"] == sha  # names the starting weights even after their folder is overwritten
    card = (tmp_path / "run" / "export" / "eagle3" / "CARD.md").read_text()
    assert f"Fine-tuned from the head in `{(tmp_path / 'head').resolve()}` (model.safetensors sha256 {sha};" in card
    _, _, ids_out = eagle3_io.load_eagle3(tmp_path / "run" / "export" / "eagle3", target=cfg)
    np.testing.assert_array_equal(ids_out, ids)  # the draft vocabulary came with the head


@PIPELINE
def test_train_smollm2_distills_the_draft_model_from_the_cached_teacher(tmp_path):
    """``--teacher-cache``: the draft stage takes the target's logits from hidden states computed once;
    the preset in the record says so, and the exported model still decodes equal to AR greedy."""
    from training import train_smollm2
    argv = ["--preset", "cpu-tiny", "--out", str(tmp_path / "run"), "--only", "draft", "--teacher-cache"]
    assert train_smollm2.main(argv) == 0
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    art = res["artifacts"]["draft"]
    assert res["preset"]["draft_teacher_cache"] is True and art["steps"] == 6
    assert art["tau"]["greedy_equals_ar"] is True and np.isfinite(art["heldout"]["loss"])
    assert "computed once over the corpus" in (tmp_path / "run" / "export" / "draft" / "CARD.md").read_text()
    from training import cli
    with pytest.raises(ValueError, match="--teacher-cache applies to the draft model"):
        cli.main(["medusa", "--out", str(tmp_path / "x"), "--teacher-cache"])


def test_init_record_names_a_shipped_head_by_its_repo_path():
    from training import train_smollm2
    folder = shipped.path("smollm2-135m-instruct", "eagle3")
    rec = train_smollm2.init_record(str(folder))
    assert rec["init_from"] == "specjax/shipped/smollm2-135m-instruct/eagle3"
    assert rec["init_sha256"] == hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()


@PIPELINE
def test_specjax_train_cli_trains_and_exports(tmp_path):
    from specjax.errors import AssetsMissing
    from training import cli
    try:
        decontam.eval_texts()
    except AssetsMissing:
        pytest.skip("MT-bench/HumanEval not fetched (the CLI keeps them out of the corpus): run `specjax fetch`")
    model_dir = tiny.save_hf(tmp_path / "tiny")
    args = ["medusa", "--model", str(model_dir), "--out", str(tmp_path / "run"), "--dtype", "float32", "--n-chat", "4",
            "--n-code", "4", "--max-new-tokens", "16", "--seq-len", "512", "--steps", "3", "--batch-size", "2",
            "--num-heads", "2"]
    assert cli.main(args) == 0
    mcfg, params = medusa_io.load_medusa(tmp_path / "run" / "export" / "medusa", tiny.target_config())
    assert mcfg.num_heads == 2 and params["w_KNDD"].shape == (2, 1, 64, 64)
    assert (tmp_path / "run" / "corpus" / "manifest.json").is_file()
    # a draft model fine-tuned from a saved one (same corpus settings: the corpus is reused), its vocabulary kept
    from specjax.heads import draft_io
    from specjax.loading import load_model
    cfg, tp = tiny.target()
    dcfg, dp = recipes.init_draft(tp, cfg, 1)
    draft_io.save_draft_model(tmp_path / "d", {**recipes.shared_of(tp, cfg), **dp}, dcfg, shared_embedding=True,
                              vocab_ids=np.arange(0, 256, 4))
    args[0], args[args.index("--num-heads")] = "draft", "--layers"
    args[args.index("--layers") + 1] = "1"
    assert cli.main(args + ["--init", str(tmp_path / "d")]) == 0
    out_cfg, out_params = draft_io.load_draft_model(tmp_path / "run" / "export" / "draft")
    assert out_cfg.n_layers == 1 and out_params["vocab_ids"].shape == (64,)
    assert load_model(tmp_path / "run" / "export" / "draft")[0].n_layers == 1  # still an ordinary checkpoint
    with pytest.raises(ValueError, match="fine-tunes an EAGLE-3 head or a draft model"):
        cli.main(["medusa", "--out", str(tmp_path / "x"), "--init", str(tmp_path / "d")])
