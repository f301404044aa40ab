"""storage/migration.py, the one home of old names: old module paths import with a warning, moved config keys are
carried to their new names (a note only when a label says a person wrote them; conflicting values fail), a recipe's
base drops every name of the frozen model, and saved denoiser configs get the activation they were trained with."""

from __future__ import annotations

import importlib
import sys

import pytest
from omegaconf import OmegaConf

from tcsm.core.errors import ConfigError
from tcsm.storage import migration


def test_old_module_path_imports_its_new_home_with_a_warning(monkeypatch):
    monkeypatch.delitem(sys.modules, "tcsm.batch", raising=False)
    with pytest.warns(DeprecationWarning, match="tcsm.batch moved to tcsm.core.batch"):
        old = importlib.import_module("tcsm.batch")
    from tcsm.core.batch import Batch

    assert old.Batch is Batch


def test_move_keys_carries_values_and_notes_once(capsys, monkeypatch):
    monkeypatch.setattr(migration, "_noted", set())
    layer = OmegaConf.create({"objective": {"sir_k": 4, "name": "tcsm"}})
    moved = migration.move_keys(layer, "config x.yaml")
    assert OmegaConf.to_container(moved) == {"objective": {"name": "tcsm"}, "sample": {"sir_k": 4}}
    assert layer.objective.sir_k == 4  # the caller's layer is not changed
    assert capsys.readouterr().err == "tcsm: note: objective.sir_k is now sample.sir_k (read as sample.sir_k=4; in config x.yaml)\n"
    migration.move_keys(layer, "config x.yaml")
    assert capsys.readouterr().err == ""


def test_move_keys_is_silent_for_saved_runs(capsys, monkeypatch):
    monkeypatch.setattr(migration, "_noted", set())
    moved = migration.move_keys(OmegaConf.create({"model": {"reference": "runs/r", "reference_ema": None}}), None)
    assert OmegaConf.to_container(moved) == {"model": {}, "reference": {"path": "runs/r"}}  # None: dropped, not carried
    assert capsys.readouterr().err == ""


def test_kept_values_stay_in_place():
    layer = OmegaConf.create({"objective": {"reference": "ema"}})
    assert migration.move_keys(layer, "x") is layer


@pytest.mark.parametrize(
    "layer",
    [{"target": {"teacher": "a"}, "reference": {"path": "b"}}, {"target": {"teacher": "a", "pretrained": "b"}}],
)
def test_conflicting_names_fail(layer):
    with pytest.raises(ConfigError, match="both set, to different values"):
        migration.move_keys(OmegaConf.create(layer), None)


def test_without_reference_drops_every_name_of_the_frozen_model():
    run = {"reference": {"path": "r"}, "target": {"name": "x", "teacher": "t", "ema": True},
           "objective": {"reference": "previous", "reference_ema": True}, "model": {"reference": "m"}}  # fmt: skip
    out = migration.without_reference(run)
    assert out == {"target": {"name": "x"}, "objective": {"reference": "previous"}, "model": {}}
    assert run["target"]["teacher"] == "t"  # a copy


def test_saved_denoiser_configs_get_their_old_activation():
    config = {"model": {"name": "denoiser", "reference_model": {"name": "denoiser"}}}
    migration.migrate_saved_config(config)
    assert config["model"]["activation"] == "gelu_tanh" == config["model"]["reference_model"]["activation"]
    kept = {"model": {"name": "denoiser", "activation": "gelu"}}
    migration.migrate_saved_config(kept)
    assert kept["model"]["activation"] == "gelu"
