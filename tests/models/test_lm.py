"""LMs of p_1 (MLM, causal, Hollow), their training losses and Hugging Face adapters (MATH.md §4)."""

from __future__ import annotations

import pytest
import torch

from tcsm.models.lm import LMConfig
from tcsm.models.lm_families import build_lm
from tcsm.objectives.lm import (
    AutoregressiveLoss,
    MaskedLMLoss,
    PseudoLikelihoodLoss,
    conditional_nll,
    make_lm_loss,
)
from tcsm.targets.parametric import MLMTeacher, make_teacher

V, L = 5, 6


def _random_model(family: str, seed: int = 0, **kw):
    """A tiny model with large random weights, so its conditionals are far from uniform."""
    torch.manual_seed(seed)
    m = build_lm(family, "tiny", vocab_size=V, **kw)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.3)
    return m.eval()


@pytest.mark.parametrize("family", ["mlm", "causal", "hollow"])
def test_shapes_and_uniform_init(family):
    m = build_lm(family, "tiny", vocab_size=V)
    x = torch.randint(0, V, (3, L))
    out = m(x)
    assert out.shape == (3, L, V) and out.dtype == torch.float32
    assert torch.allclose(out, torch.zeros_like(out))  # zero head: uniform at initialisation


def test_config_validation():
    with pytest.raises(ValueError, match="vocab_size"):
        LMConfig(vocab_size=1)
    with pytest.raises(ValueError, match="unknown LM family"):
        build_lm("rnn", vocab_size=V)
    with pytest.raises(ValueError, match="vocab_size"):
        build_lm("mlm", "tiny")


def test_causal_kv_cache_and_soft_inputs_match_forward():
    m = _random_model("causal")
    x = torch.randint(0, V, (2, L))
    ref = m(x)
    logits, cache = m.kv_cache(x)
    assert torch.allclose(logits, ref, atol=1e-5)
    ids = m.input_ids(x)
    for s in range(1, L):
        past = [(k[:, :, :s], v[:, :, :s]) for k, v in cache]
        assert torch.allclose(m.extend(ids[:, s:], past, s), ref[:, s:], atol=1e-5)
    onehot = torch.nn.functional.one_hot(x, V).float()
    assert torch.allclose(m.forward_soft(onehot), ref, atol=1e-5)


def test_causal_is_causal():
    m = _random_model("causal")
    x = torch.randint(0, V, (1, L))
    ref = m(x)
    for j in range(L):
        y = x.clone()
        y[0, j] = (y[0, j] + 1) % V
        out = m(y)
        assert torch.allclose(out[:, : j + 1], ref[:, : j + 1], atol=1e-6)  # logits ≤ j never see x^j
        if j < L - 1:
            assert not torch.allclose(out[:, j + 1 :], ref[:, j + 1 :], atol=1e-4)


def test_hollow_output_invariant_to_own_token_and_depends_on_all_others():
    """Perturbation: changing x^j changes the output at every i ≠ j and never at i = j (MATH.md §4, Hollow)."""
    m = _random_model("hollow", n_mix_layers=2)
    x = torch.randint(0, V, (2, L))
    ref = m(x)
    for j in range(L):
        for delta in range(1, V):
            y = x.clone()
            y[:, j] = (y[:, j] + delta) % V
            diff = (m(y) - ref).abs().amax(dim=(0, 2))  # [L]
            assert diff[j] < 1e-6
            if delta == 1:
                assert (diff[torch.arange(L) != j] > 1e-5).all()


def test_hollow_gradient_structure():
    """∂ output_i / ∂ embedding_j is zero exactly on the diagonal (relaxed inputs through the embedding)."""
    m = _random_model("hollow", n_mix_layers=1)
    x = torch.randint(0, V, (1, L))
    emb = m.embed
    grads = torch.zeros(L, L)
    for i in range(L):
        e = emb(x).detach().requires_grad_(True)
        orig = emb.forward
        emb.forward = lambda ids, e=e, orig=orig: e if ids.shape == x.shape else orig(ids)
        try:
            out = m(x)
        finally:
            emb.forward = orig
        (g,) = torch.autograd.grad(out[0, i].sum(), e)
        grads[i] = g[0].abs().sum(-1)
    assert torch.all(grads.diagonal() == 0)
    assert torch.all(grads[~torch.eye(L, dtype=torch.bool)] > 0)


def test_hollow_without_mixing_layers():
    m = _random_model("hollow", n_mix_layers=0)
    x = torch.randint(0, V, (2, L))
    y = x.clone()
    y[:, 2] = (y[:, 2] + 1) % V
    assert torch.allclose(m(x)[:, 2], m(y)[:, 2], atol=1e-6)


def test_mlm_teacher_matches_position_loop():
    """One pass per position, batched (B·L sequences, chunked) = an explicit loop over positions (MATH.md §4)."""
    m = _random_model("mlm")
    x = torch.randint(0, V, (3, L))
    loop = torch.stack(
        [torch.log_softmax(m(x.clone().index_fill_(1, torch.tensor([i]), V))[:, i], -1) for i in range(L)], 1
    )
    for max_tokens in (1 << 16, L * L):  # one chunk, or one sequence per chunk
        got = MLMTeacher(m, max_tokens=max_tokens)(x)
        assert torch.allclose(got, loop, atol=1e-5)


def test_teacher_is_frozen_and_in_eval_mode():
    m = _random_model("hollow")
    m.train()
    teacher = make_teacher(m)
    m.train()  # e.g. a trainer flips modes; the teacher must still run deterministically
    x = torch.randint(0, V, (2, L))
    out = teacher(x)
    assert not m.training and not out.requires_grad
    assert all(not p.requires_grad for p in m.parameters())


@pytest.mark.parametrize("family", ["mlm", "causal", "hollow"])
def test_clean_losses_train(family):
    torch.manual_seed(0)
    m = build_lm(family, "tiny", vocab_size=V)
    loss_fn = make_lm_loss(family)
    # Deterministic data: sequences of a cyclic pattern, so every family can fit it.
    x = (torch.arange(L)[None, :] + torch.randint(0, V, (16, 1))) % V
    g = torch.Generator().manual_seed(0)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    history = []
    for _ in range(60):
        loss, metrics = loss_fn(m, x, g)
        history.append(metrics["loss"])
        opt.zero_grad()
        loss.backward()
        opt.step()
    first = history[0]
    assert abs(first - torch.log(torch.tensor(float(V))).item()) < 1e-4  # uniform start
    assert sum(history[-10:]) / 10 < 0.7 * first  # averaged: the MLM loss is noisy (random masks)
    assert metrics["bpc"] == pytest.approx(metrics["loss"] / 0.6931471805599453)
    if family != "mlm":
        teacher = make_teacher(m.eval())
        assert conditional_nll(teacher, x) < first


def test_mlm_loss_corruption():
    loss = MaskedLMLoss(mask_rate=(0.2, 0.6), random_rate=0.1, keep_rate=0.1)
    x = torch.randint(0, V, (64, 32))
    inp, chosen = loss.corrupt(x, V, V, torch.Generator().manual_seed(0))
    assert chosen.any(1).all()
    assert torch.equal(inp[~chosen], x[~chosen])
    masked_frac = (inp[chosen] == V).float().mean()
    assert 0.7 < masked_frac < 0.9
    with pytest.raises(ValueError):
        MaskedLMLoss(mask_rate=0.0)
    assert isinstance(make_lm_loss("causal"), AutoregressiveLoss)
    assert isinstance(make_lm_loss("hollow"), PseudoLikelihoodLoss)


# --- Hugging Face adapters (tiny random models from configs; nothing is downloaded) -----------------------

TOKEN_IDS = [3, 4, 5, 6, 7]  # HF ids of our V = 5 clean tokens


def test_hf_masked_lm_adapter():
    tf = pytest.importorskip("transformers")
    from tcsm.models.hf import HFMaskedLM

    torch.manual_seed(0)
    cfg = tf.BertConfig(
        vocab_size=12,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
    )
    hf = tf.BertForMaskedLM(cfg).eval()
    ad = HFMaskedLM(hf, TOKEN_IDS, mask_token_id=1)
    x = torch.randint(0, V + 1, (2, L))
    ids = torch.tensor(TOKEN_IDS + [1])[x]
    ref = hf(input_ids=ids).logits[..., TOKEN_IDS]
    assert torch.allclose(ad(x), ref, atol=1e-6)
    # As a teacher: same conditionals as a loop of direct HF calls with one [MASK].
    xc = torch.randint(0, V, (2, L))
    got = make_teacher(ad)(xc)
    for i in range(L):
        ids = torch.tensor(TOKEN_IDS)[xc]
        ids[:, i] = 1
        want = torch.log_softmax(hf(input_ids=ids).logits[:, i, TOKEN_IDS], -1)
        assert torch.allclose(got[:, i], want, atol=1e-5)
    with pytest.raises(ValueError):
        HFMaskedLM(hf, [3, 3, 4], mask_token_id=1)


def test_hf_causal_lm_adapter():
    tf = pytest.importorskip("transformers")
    from tcsm.models.hf import HFCausalLM
    from tcsm.targets.ar import ExactARScore, score_candidates_naive

    torch.manual_seed(0)
    cfg = tf.GPT2Config(
        vocab_size=12, n_embd=16, n_layer=1, n_head=2, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    hf = tf.GPT2LMHeadModel(cfg).eval()
    ad = HFCausalLM(hf, TOKEN_IDS)
    assert int(ad.table[-1]) == 0  # BOS from the config
    x = torch.randint(0, V, (2, L))
    ids = torch.cat([torch.zeros(2, 1, dtype=torch.long), torch.tensor(TOKEN_IDS)[x[:, :-1]]], 1)
    ref = hf(input_ids=ids).logits[..., TOKEN_IDS]
    assert torch.allclose(ad(x), ref, atol=1e-6)
    onehot = torch.nn.functional.one_hot(x, V).float()
    assert torch.allclose(ad.forward_soft(onehot), ref, atol=1e-5)
    # Exact AR scores reuse the HF key/value cache and agree with full-sequence scoring and log p differences.
    logits, cache = ad.kv_cache(x)
    assert torch.allclose(logits, ref, atol=1e-5) and len(cache) == 1 and cache[0][0].shape[2] == L
    ell = ExactARScore()(ad, x)
    cands = torch.arange(V).expand(2, L, V)
    assert torch.allclose(ell, score_candidates_naive(ad, x, cands), atol=1e-5)
    y = x.clone()
    y[:, 2] = (x[:, 2] + 1) % V
    want = ad.log_prob(y) - ad.log_prob(x)
    assert torch.allclose(ell[torch.arange(2), 2, y[:, 2]], want, atol=1e-5)


def test_hf_models_train_and_teach_from_config(tmp_path):
    """model.name=hf_mlm | hf_causal from a local directory (nothing downloaded), trained by `lm`, then
    loaded back as a teacher."""
    tf = pytest.importorskip("transformers")
    from tcsm.builders.config import load_config
    from tcsm.builders.targets import load_teacher
    from tcsm.train.trainer import Trainer

    torch.manual_seed(0)
    bert = tf.BertForMaskedLM(
        tf.BertConfig(vocab_size=12, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=32)
    )  # fmt: skip
    gpt = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=12, n_embd=16, n_layer=1, n_head=2, n_positions=32))
    bert.save_pretrained(tmp_path / "bert")
    gpt.save_pretrained(tmp_path / "gpt")
    common = [
        "data.kind=synthetic", "data.vocab_size=5", "data.seq_len=8", "data.num_train=64", "data.num_valid=8",
        "data.num_test=8", "train.batch_size=8", "train.precision=fp32", "train.device=cpu", "train.steps=3",
        "train.progress=false", "train.tensorboard=false", "train.eval_examples=8", "train.eval_every=0",
        "train.save_every=0", "sample.num=0", "objective.name=lm", "model.token_ids=[3,4,5,6,7]",
        "model.local_files_only=true", "model.special_token_id=1",
    ]  # fmt: skip
    for name, sub in (("hf_mlm", "bert"), ("hf_causal", "gpt")):
        cfg = load_config(None, common + [f"model.name={name}", f"model.name_or_path={tmp_path / sub}"])
        run = tmp_path / f"run-{name}"
        summary = Trainer.from_config(cfg, run, log=lambda s: None).fit()
        assert summary["bound"] == ("pseudo-nll" if name == "hf_mlm" else "ar-nll")
        teacher = load_teacher(run, vocab_size=5)
        out = teacher(torch.randint(0, 5, (2, 8)))
        assert out.shape == (2, 8, 5) and torch.allclose(out.exp().sum(-1), torch.ones(2, 8), atol=1e-5)
