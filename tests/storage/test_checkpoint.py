"""Checkpoints: no pickle, atomic writes, validation with fallback, exact optimizer round trip, public loader."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import torch
from train_helpers import final_weights, restore_torch_threads, tiny  # noqa: F401

from tcsm.builders.config import load_config
from tcsm.builders.loading import load_checkpoint
from tcsm.core.errors import CheckpointError
from tcsm.storage.checkpoint import (
    list_checkpoints,
    pack,
    read_state,
    resolve_checkpoint,
    save_checkpoint,
    unpack,
    validate_checkpoint,
)
from tcsm.storage.fileio import file_digest
from tcsm.train.trainer import Trainer


def test_pack_round_trip_keeps_types_exactly():
    obj = {
        "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(2, 3)}, 1: {}},
        "groups": [{"betas": (0.9, 0.99), "lr": 1e-3, "params": [0, 1], "foreach": None}],
        "np": np.arange(4, dtype=np.int64),
        "nan": math.nan,
        "inf": -math.inf,
        "flag": True,
        "__odd": "key",
    }
    tensors: dict = {}
    packed = pack(obj, tensors)
    back = unpack(json.loads(json.dumps(packed)), tensors)
    assert set(back["state"]) == {0, 1}
    assert torch.equal(back["state"][0]["exp_avg"], obj["state"][0]["exp_avg"])
    assert back["groups"][0]["betas"] == (0.9, 0.99) and isinstance(back["groups"][0]["betas"], tuple)
    assert np.array_equal(back["np"], obj["np"])
    assert math.isnan(back["nan"]) and back["inf"] == -math.inf and back["__odd"] == "key"
    with pytest.raises(TypeError, match="no pickle"):
        pack({"f": object()}, {})


def test_optimizer_state_round_trip_continues_identically():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95))
    for _ in range(3):
        model(torch.randn(5, 4)).square().sum().backward()
        opt.step()
        opt.zero_grad()
    tensors: dict = {}
    packed = json.loads(json.dumps(pack(opt.state_dict(), tensors)))
    model2 = torch.nn.Linear(4, 3)
    model2.load_state_dict(model.state_dict())
    opt2 = torch.optim.AdamW(model2.parameters(), lr=0.5)
    opt2.load_state_dict(unpack(packed, tensors))
    x = torch.randn(5, 4)
    for m, o in ((model, opt), (model2, opt2)):
        m(x).square().sum().backward()
        o.step()
    assert torch.equal(model.weight, model2.weight) and torch.equal(model.bias, model2.bias)


def _save(root, step, value=0.0, keep_last=0):
    model = torch.nn.Linear(2, 2)
    torch.nn.init.constant_(model.weight, value)
    return save_checkpoint(
        root, step, model=model, state={"step": step, "x": torch.ones(2)}, keep_last=keep_last
    )


def test_layout_has_no_pickle_and_a_manifest(tmp_path):
    d = _save(tmp_path, 7)
    assert d.name == "step_00000007" and (tmp_path / "latest").read_text().strip() == d.name
    names = {f.name for f in d.iterdir()}
    assert names == {"model.safetensors", "state.safetensors", "state.json", "manifest.json"}
    for f in d.iterdir():
        assert not f.read_bytes().startswith(b"\x80"), f"{f.name} looks like a pickle"
    manifest = validate_checkpoint(d)
    assert set(manifest["files"]) == names - {"manifest.json"}
    step, state = read_state(d)
    assert step == 7 and torch.equal(state["x"], torch.ones(2))
    assert not list(tmp_path.glob(".tmp-*")), "temporary directory left behind"


def test_damaged_latest_falls_back_to_previous_complete_checkpoint(tmp_path):
    _save(tmp_path, 1, 1.0)
    d2 = _save(tmp_path, 2, 2.0)
    data = bytearray((d2 / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (d2 / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum"):
        validate_checkpoint(d2)
    with pytest.warns(UserWarning, match="skipped damaged"):
        assert resolve_checkpoint(tmp_path).name == "step_00000001"
    # An explicitly named damaged checkpoint is an error, never silently replaced.
    with pytest.raises(CheckpointError, match="corrupt"):
        resolve_checkpoint(d2)


def test_half_written_checkpoint_is_never_loaded(tmp_path):
    _save(tmp_path, 1)
    # A writer killed before the rename leaves a hidden temp dir; one killed after (impossible with rename, but
    # e.g. a copied directory) lacks its manifest. Neither is used.
    (tmp_path / ".tmp-step_00000002-dead").mkdir()
    partial = tmp_path / "step_00000003"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"garbage")
    (tmp_path / "latest").write_text("step_00000003\n")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert resolve_checkpoint(tmp_path).name == "step_00000001"
    with pytest.raises(CheckpointError, match="incomplete"):
        validate_checkpoint(partial)
    only_bad = tmp_path / "other"
    (only_bad / "step_00000005").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        resolve_checkpoint(only_bad)
    with pytest.raises(CheckpointError, match="does not exist"):
        resolve_checkpoint(tmp_path / "missing")


def test_keep_last_prunes_old_checkpoints_and_resave_replaces(tmp_path):
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000003", "step_00000004"]
    _save(tmp_path, 4, value=5.0, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000003", "step_00000004"]
    validate_checkpoint(tmp_path / "step_00000004")


def test_load_checkpoint_public_api_and_architecture_check(tmp_path):
    cfg = load_config(
        "synthetic", tiny("train.steps=3", "train.eval_every=0", "train.sample_every=0", "sample.num=0")
    )
    Trainer.from_config(cfg, tmp_path, log=lambda s: None).fit()
    ckpt = load_checkpoint(tmp_path, device="cpu")
    assert ckpt.step == 3 and ckpt.weights == "ema" and not ckpt.model.training
    ema = final_weights(tmp_path, "ema")
    for k, v in ckpt.model.state_dict().items():
        assert torch.equal(v, ema[k])
    raw = load_checkpoint(tmp_path / "checkpoints" / "step_00000003", ema=False)
    model_w = final_weights(tmp_path, "model")
    assert all(torch.equal(v, model_w[k]) for k, v in raw.model.state_dict().items())
    model, config, *_ = ckpt
    x = torch.full((2, 16), ckpt.build_path().mask_id)
    assert model(x, torch.rand(2)).shape == (2, 16, 8)
    assert config.model.n_layers == 2
    with pytest.raises(CheckpointError, match="model.n_layers"):
        load_checkpoint(tmp_path, overrides=["model.n_layers=3"])
    with pytest.raises(CheckpointError, match="path.source"):
        load_checkpoint(tmp_path, overrides=["path.source=uniform"])
    # eval settings may change freely
    assert load_checkpoint(tmp_path, overrides=["eval.num_t=3"]).config.eval.num_t == 3


def test_a_checkpoint_saved_before_the_activation_field_rebuilds_its_tanh_gelu(tmp_path):
    cfg = load_config("synthetic", tiny("train.steps=2", "train.eval_every=0", "train.sample_every=0", "sample.num=0"))
    Trainer.from_config(cfg, tmp_path, log=lambda s: None).fit()
    assert load_checkpoint(tmp_path).model.cfg.activation == "gelu"  # new runs: exact GELU
    step_dir = tmp_path / "checkpoints" / "step_00000002"
    meta = json.loads((step_dir / "state.json").read_text())
    del meta["state"]["config"]["model"]["activation"]  # as written before the field existed
    (step_dir / "state.json").write_text(json.dumps(meta))
    manifest = json.loads((step_dir / "manifest.json").read_text())
    manifest["files"]["state.json"] = {"sha256": file_digest(step_dir / "state.json"),
                                       "bytes": (step_dir / "state.json").stat().st_size}
    (step_dir / "manifest.json").write_text(json.dumps(manifest))
    old = load_checkpoint(tmp_path)
    assert old.model.cfg.activation == "gelu_tanh" and old.model.blocks[0].mlp.approximate == "tanh"
    x = torch.full((2, 16), old.build_path().mask_id)
    t = torch.rand(2)
    with pytest.raises(CheckpointError, match="model.activation"):  # part of the architecture
        load_checkpoint(tmp_path, overrides=["model.activation=gelu"])
    from tcsm.models import build_denoiser

    exact = build_denoiser({**old.model.cfg.to_dict(), "activation": "gelu"}).eval()
    exact.load_state_dict(old.model.state_dict())  # the same weights, the other function
    assert not torch.equal(old.model(x, t), exact(x, t))


def test_the_activation_is_checked():
    from tcsm.models import build_denoiser

    with pytest.raises(ValueError, match="activation"):
        build_denoiser("tiny", vocab_size=4, num_states=5, activation="relu")
