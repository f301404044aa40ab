"""LoRA adapters on tcsm models (tcsm.models.lora, tcsm.builders.lora): they start as the identity, a target that
matches nothing is one line, the adapters-off reference is the base itself (the same tensors, not a copy), merging is
the adapted function, a LoRA run resumes exactly, and a LoRA reward run shares its reference."""

from __future__ import annotations

import pytest
import torch
from train_helpers import assert_same_weights, final_weights, restore_torch_threads, tiny  # noqa: F401

from tcsm.builders.config import load_config
from tcsm.builders.lora import with_lora
from tcsm.core.errors import ConfigError
from tcsm.models import build_denoiser
from tcsm.models.lora import adapters_off, add_adapters, fold_adapters, merge, start_weights
from tcsm.train.trainer import Trainer

pytest.importorskip("peft")

LORA = ("train.lora.r=2", "train.lora.target_modules=[qkv,out]")
QUIET = ("train.eval_every=0", "train.sample_every=0", "train.save_every=0")


def _model(seed=0):
    """A tiny denoiser with random weights everywhere (its own init zeroes the output layer)."""
    model = build_denoiser("tiny", vocab_size=8, num_states=9, d_model=32, n_layers=1, n_heads=2, cond_dim=16,
                           max_len=16).eval()  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return model


def _perturb(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g))


def _io(seed=2):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 9, (3, 16), generator=g), torch.rand(3, generator=g)


def test_adapters_start_as_the_identity_and_train_only_themselves():
    x, t = _io()
    model = _model()
    before = model(x, t)
    add_adapters(model, r=2, alpha=4, dropout=0.0, target_modules=["qkv", "out"], seed=0)
    assert torch.equal(model(x, t), before)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


def test_adapters_off_is_the_base_itself_and_merging_is_the_adapted_function():
    x, t = _io()
    base = _model()
    want = base(x, t)
    model = add_adapters(_model(), r=2, alpha=4, dropout=0.0, target_modules=["qkv"], seed=0)
    _perturb(model)
    adapted = model(x, t)
    assert not torch.allclose(adapted, want)
    off = adapters_off(model)
    assert torch.equal(off(x, t), want) and not list(off.parameters())  # no weights of its own
    assert torch.equal(model(x, t), adapted)  # the adapters are back after the call
    merged = merge(model)
    torch.testing.assert_close(merged(x, t), adapted, atol=1e-5, rtol=0)
    assert set(merged.state_dict()) == set(base.state_dict())  # plain layers again


def test_adapters_off_is_deterministic_while_the_model_trains():
    """The reference runs the base in eval mode whatever the caller's mode: with dropout 0.3 in the base and the
    model training, two reference calls are equal (and equal the base in eval mode), the model stays in training
    mode, and its own calls still draw dropout."""
    x, t = _io()
    model = build_denoiser("tiny", vocab_size=8, num_states=9, d_model=32, n_layers=1, n_heads=2, cond_dim=16,
                           max_len=16, dropout=0.3)  # fmt: skip
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(0)))
    want = model.eval()(x, t)
    add_adapters(model, r=2, alpha=4, dropout=0.3, target_modules=["qkv"], seed=0)
    off = adapters_off(model)
    model.train()
    torch.manual_seed(0)
    a, b = off(x, t), off(x, t)
    assert model.training
    assert torch.equal(a, b) and torch.equal(a, want)
    assert not torch.equal(model(x, t), model(x, t))  # dropout is on in the model's own calls


def test_a_lora_start_from_plain_weights_takes_them_as_its_base_and_folds_a_lora_runs_adapters():
    x, t = _io()
    source = _model(seed=3)
    model = add_adapters(_model(), r=2, alpha=4, dropout=0.0, target_modules=["qkv"], seed=0)
    weights, fold = start_weights(model, source.state_dict())
    model.load_state_dict(weights)
    assert not fold and torch.equal(model(x, t), source(x, t))
    _perturb(model)
    adapted = model(x, t)
    fresh = add_adapters(_model(), r=2, alpha=4, dropout=0.0, target_modules=["qkv"], seed=0)
    weights, fold = start_weights(fresh, model.state_dict())
    fresh.load_state_dict(weights)
    fold_adapters(fresh, seed=0)
    assert fold and torch.allclose(adapters_off(fresh)(x, t), adapted, atol=1e-5)  # the base holds the old adapters
    assert all(torch.count_nonzero(p) == 0 for n, p in fresh.named_parameters() if "lora_B" in n)


def test_a_target_that_matches_no_layer_is_one_line_naming_the_layers():
    cfg = load_config("synthetic", tiny("train.lora.r=2", "train.lora.target_modules=[q_proj]"))
    with pytest.raises(ConfigError) as e:
        with_lora(_model(), cfg)
    msg = str(e.value)
    assert "\n" not in msg and "q_proj" in msg and "qkv" in msg
    cfg = load_config("synthetic", tiny("train.lora.r=2"))
    with pytest.raises(ConfigError, match="target_modules"):
        with_lora(_model(), cfg)


def test_a_lora_run_resumes_exactly(tmp_path):
    def fit(where, *extra, resume=None):
        cfg = load_config("synthetic", tiny(*QUIET, *LORA, *extra))
        Trainer.from_config(cfg, where, resume=resume, log=lambda s: None).fit()

    fit(tmp_path / "full", "train.steps=4", "train.save_every=2")
    fit(tmp_path / "part", "train.steps=2", "train.save_every=2")
    fit(tmp_path / "part", "train.steps=4", "train.save_every=2", resume=True)
    for which in ("model", "ema"):
        assert_same_weights(final_weights(tmp_path / "full", which), final_weights(tmp_path / "part", which))
    weights = final_weights(tmp_path / "full")
    assert any("lora_A" in k for k in weights) and any(".base_layer." in k for k in weights)


def test_full_parameter_training_stays_the_default():
    cfg = load_config("synthetic", tiny())
    assert cfg.train.lora.r == 0
    model = with_lora(_model(), cfg)
    assert all(p.requires_grad for p in model.parameters())


def test_adapters_on_a_tied_weight_cannot_be_merged_in_one_line():
    """Two layers sharing one weight (DiffusionGemma's encoder and decoder): folding an adapter into it would change
    the other layer too, so merging is refused, naming both."""
    shared = torch.nn.Linear(4, 4)
    model = torch.nn.Sequential(shared, torch.nn.ReLU(), torch.nn.Linear(4, 4))
    model[2].weight = shared.weight
    add_adapters(model, r=2, alpha=4, dropout=0.0, target_modules=["0"], seed=0)
    with pytest.raises(ValueError) as e:
        merge(model)
    assert "\n" not in str(e.value) and "shared with" in str(e.value) and "--lora-adapter" in str(e.value)


def test_a_diffusion_gemma_lora_run_exports_an_adapter_its_own_class_loads(tmp_path, capsys):
    """LoRA on DiffusionGemma (tied encoder / decoder weights, so "re:" targets its attention projections): merged
    export is one line, the PEFT adapter on `DiffusionGemmaForBlockDiffusion` gives tcsm's logits."""
    tf = pytest.importorskip("transformers")
    if not hasattr(tf, "DiffusionGemmaForBlockDiffusion"):
        pytest.skip("this transformers has no DiffusionGemma")
    from diffusion_gemma_helpers import tiny_hf
    from peft import PeftModel

    import tcsm
    from tcsm.cli import main

    V, K, L = 8, 4, 16
    tiny_hf(V=V, k=K, window=3).save_pretrained(tmp_path / "model")
    run = ["data.kind=synthetic", f"data.vocab_size={V}", f"data.seq_len={L}", "data.num_train=32", "data.num_valid=8",
           "data.num_test=8", "train.batch_size=4", "train.device=cpu", "train.precision=fp32", "train.eval_every=0",
           "train.sample_every=0", "sample.num=0", "train.steps=2", "train.threads=1", "train.progress=false",
           "train.tensorboard=false", "optim.lr=3e-2", "path.source=uniform", "model.name=diffusion_gemma",
           f"path.block_length={K}", f"model.name_or_path={tmp_path / 'model'}", "train.lora.r=2",
           'train.lora.target_modules=["re:.*(language_model|decoder).*(q_proj|v_proj)"]']  # fmt: skip
    assert main(["train", "-o", str(tmp_path / "run"), *run]) == 0
    capsys.readouterr()
    assert main(["export", str(tmp_path / "run"), "-o", str(tmp_path / "merged"), "--merge-lora"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tied weights" in err[0]
    assert main(["export", str(tmp_path / "run"), "-o", str(tmp_path / "adapter"), "--lora-adapter"]) == 0
    base = tf.DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path / "model").eval()
    theirs = PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
    ours = tcsm.from_pretrained(tmp_path / "run")
    g = torch.Generator().manual_seed(0)
    x1, xt = torch.randint(0, V, (2, L), generator=g), torch.randint(0, V, (2, L), generator=g)
    with torch.no_grad():
        logits = ours(xt, None, x1=x1)
        for b in range(1, L // K):
            own = theirs(input_ids=x1[:, : b * K], decoder_input_ids=xt[:, b * K : (b + 1) * K]).logits
            torch.testing.assert_close(own, logits[:, b * K : (b + 1) * K], atol=1e-5, rtol=0)


def test_a_dropout_of_one_is_refused():
    cfg = load_config("synthetic", tiny("train.lora.r=2", "train.lora.target_modules=[qkv]", "train.lora.dropout=1.0"))
    with pytest.raises(ConfigError, match=r"dropout must be in \[0, 1\)"):
        with_lora(_model(), cfg)


def test_the_reference_is_the_base_only_when_it_loads_the_weights_the_run_starts_from(monkeypatch):
    from omegaconf import OmegaConf

    from tcsm.builders.lora import shares_base
    from tcsm.builders.registry import ReferenceUse

    monkeypatch.setattr("tcsm.storage.checkpoint.resolve_checkpoint", lambda p: p)
    uses = [(None, ReferenceUse("reference.path"))]

    def cfg(ema, init):
        c = load_config("synthetic", tiny("train.lora.r=2", "train.lora.target_modules=[qkv]", "reference.path=/x",
                                          f"reference.ema={ema}", f"train.init_weights={init}"))
        c = OmegaConf.create(OmegaConf.to_container(c))
        c.train.init_from = "/x"  # set after loading: the config loader reads an init_from checkpoint's architecture
        return c

    assert shares_base(cfg("true", "ema"), uses) and shares_base(cfg("false", "model"), uses)
    assert not shares_base(cfg("true", "model"), uses) and not shares_base(cfg("false", "ema"), uses)
