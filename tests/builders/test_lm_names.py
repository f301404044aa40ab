"""The models of the data that are not diffusion models are named LMs (mlm, causal-lm, hollow; objective `lm`);
their old "clean" names still load, with a one-line note on stderr when a person wrote them."""

from __future__ import annotations

import importlib
import sys

import pytest
from omegaconf import OmegaConf

from tcsm.builders.config import load_config
from tcsm.builders.presets import list_presets
from tcsm.cli import main
from tcsm.cli.common import config_help
from tcsm.storage import migration


@pytest.mark.parametrize("old", sorted(migration.MOVED_PRESETS))
def test_an_old_preset_name_loads_its_new_preset_with_one_note(old, capsys, monkeypatch):
    monkeypatch.setattr(migration, "_noted", set())
    new = migration.MOVED_PRESETS[old]
    assert new in list_presets() and old not in list_presets()
    got = load_config(old)
    assert capsys.readouterr().err.strip().splitlines() == [f"tcsm: note: preset {old} is now {new}"]
    assert OmegaConf.to_container(got) == OmegaConf.to_container(load_config(new))
    load_config(old)
    assert capsys.readouterr().err == ""  # once per process


def test_train_help_lists_the_new_preset_names_only():
    listed = [line.split()[0] for line in config_help().splitlines() if line.startswith("  ")]
    assert {"mlm", "causal-lm", "hollow"} <= set(listed)
    assert not set(migration.MOVED_PRESETS) & set(listed)


def test_tcsm_train_reads_an_old_preset_name(capsys, monkeypatch):
    monkeypatch.setattr(migration, "_noted", set())
    assert main(["train", "-c", "clean-causal", "--print-config"]) in (0, None)
    out, err = capsys.readouterr()
    assert err.strip().splitlines() == ["tcsm: note: preset clean-causal is now causal-lm"]
    assert OmegaConf.create(out).model.name == load_config("causal-lm").model.name


def test_the_old_objective_name_reads_as_lm_with_one_note_when_written(capsys, monkeypatch):
    monkeypatch.setattr(migration, "_noted", set())
    cfg = load_config("causal-lm", ["objective.name=clean_lm"])
    assert cfg.objective.name == "lm"
    note = "tcsm: note: objective.name=clean_lm is now objective.name=lm (in the overrides)"
    assert capsys.readouterr().err.strip().splitlines() == [note]
    load_config("causal-lm", ["objective.name=clean_lm"])
    assert capsys.readouterr().err == ""  # once per process


def test_a_saved_config_with_the_old_objective_name_reads_silently(capsys, monkeypatch):
    monkeypatch.setattr(migration, "_noted", set())
    saved = OmegaConf.to_container(load_config("causal-lm"))
    saved["objective"]["name"] = "clean_lm"
    cfg = load_config(base=saved, overrides=["train.steps=3"])
    assert cfg.objective.name == "lm" and cfg.train.steps == 3
    assert OmegaConf.to_container(cfg) == OmegaConf.to_container(load_config("causal-lm", ["train.steps=3"]))
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "old, new, names",
    [
        ("tcsm.models.clean", "tcsm.models.lm", {"CleanLMConfig": "LMConfig", "CLEAN_PRESETS": "LM_PRESETS"}),
        ("tcsm.models.clean_families", "tcsm.models.lm_families", {"build_clean_model": "build_lm"}),
        ("tcsm.clean_losses", "tcsm.objectives.lm", {"make_clean_loss": "make_lm_loss"}),
    ],
)
def test_old_module_paths_and_names_still_import_with_one_warning(old, new, names, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}; import it from there") as caught:
        module = importlib.import_module(old)
    assert len(caught) == 1
    home = importlib.import_module(new)
    for old_name, new_name in names.items():
        assert getattr(module, old_name) is getattr(home, new_name)


def test_the_old_top_level_name_build_clean_model_is_build_lm():
    import tcsm

    assert tcsm.build_lm is importlib.import_module("tcsm.models.lm_families").build_lm
    assert tcsm.build_clean_model is tcsm.build_lm
    assert "build_clean_model" not in tcsm.__all__
