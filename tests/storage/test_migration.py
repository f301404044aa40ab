"""storage/migration.py, the one home of old names: old module paths import with a warning, moved config keys are
carried to their new names (a note only when a label says a person wrote them; conflicting values fail; DRE's
`objective.loss` only inside a dre objective section, whichever layer names it), a recipe's
base drops every name of the frozen model, and saved denoiser configs get the activation they were trained with."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

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


def _layers(*layers):
    return [(OmegaConf.create(layer), label) for layer, label in layers]


def test_dre_loss_under_a_lower_layers_entry_name_is_read_as_bregman_with_a_note(capsys, monkeypatch):
    """The preset names the dre objective, the override writes its old `objective.loss`: one note, new key."""
    monkeypatch.setattr(migration, "_noted", set())
    preset = {"objective": {"name": "dre", "bregman": "bce"}}
    moved = migration.move_layers(_layers((preset, "config p"), ({"objective": {"loss": "lsif"}}, "the overrides")))
    assert OmegaConf.to_container(moved[1]) == {"objective": {"bregman": "lsif"}}
    assert OmegaConf.to_container(moved[0]) == preset
    assert capsys.readouterr().err == (
        "tcsm: note: objective.loss of objective.name=dre is now objective.bregman "
        "(read as objective.bregman=lsif; in the overrides)\n"
    )


def test_dre_loss_of_a_saved_run_is_read_as_bregman_silently(capsys, monkeypatch):
    monkeypatch.setattr(migration, "_noted", set())
    (moved,) = migration.move_layers(_layers(({"objective": {"name": "dre", "loss": "gkl"}}, None)))
    assert OmegaConf.to_container(moved) == {"objective": {"name": "dre", "bregman": "gkl"}}
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "layers",
    [
        [({"objective": {"name": "tcsm", "loss": "score"}}, "x")],  # the composed objective's loss form
        [({"objective": {"name": "dre"}}, None), ({"objective": {"name": "tcsm", "loss": "score"}}, "x")],
        [({"objective": {"name": "tcsm", "loss": "distrib"}}, None), ({"objective": {"loss": "score"}}, "x")],
        [({"objective": {"loss": "distrib"}}, "x")],  # no name: the default entry, the composed objective
    ],
)
def test_objective_loss_of_other_objectives_keeps_its_name(layers, capsys):
    given = _layers(*layers)
    assert [m is g for m, (g, _) in zip(migration.move_layers(given), given)] == [True] * len(given)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("label", [None, "the overrides"])
def test_dre_loss_and_bregman_set_differently_fail_in_one_line(label):
    layer = {"objective": {"name": "dre", "loss": "lsif", "bregman": "bce"}}
    with pytest.raises(ConfigError, match=r"^objective.loss \(the old name of objective.bregman for objective.name=dre\) "):
        migration.move_layers(_layers((layer, label)))
    same = {"objective": {"name": "dre", "loss": "bce", "bregman": "bce"}}
    (moved,) = migration.move_layers(_layers((same, None)))
    assert OmegaConf.to_container(moved) == {"objective": {"name": "dre", "bregman": "bce"}}


def test_current_key_names_the_key_a_config_holds():
    dre, tcsm = {"objective": {"name": "dre", "bregman": "bce"}}, {"objective": {"name": "tcsm", "loss": "distrib"}}
    assert migration.current_key("objective.loss", "lsif", dre) == "objective.bregman"
    assert migration.current_key("objective.loss", "score", tcsm) == "objective.loss"
    assert migration.current_key("objective.sir_k", 4, tcsm) == "sample.sir_k"
    assert migration.current_key("objective.reference", "ema", dre) == "objective.reference"  # a kept value
    assert migration.current_key("train.steps", 3, dre) == "train.steps"


def test_the_config_loader_and_set_values_read_dres_old_key(capsys, monkeypatch):
    from tcsm.builders.config import load_config, set_values, to_dict

    monkeypatch.setattr(migration, "_noted", set())
    cfg = load_config("finetune-dre", ["objective.loss=lsif"])  # the name from the preset, the key from a person
    assert cfg.objective.bregman == "lsif" and "loss" not in cfg.objective
    assert "objective.loss of objective.name=dre is now objective.bregman" in capsys.readouterr().err
    saved = to_dict(load_config("finetune-dre"))
    saved["objective"]["loss"] = saved["objective"].pop("bregman")  # a run saved before the rename
    assert load_config(base=saved).objective.bregman == "bce" and capsys.readouterr().err == ""
    assert set_values(cfg, {"objective.loss": "gkl"}).objective.bregman == "gkl"
    assert load_config("synthetic", ["objective.loss=score"]).objective.loss == "score"
    assert capsys.readouterr().err == ""


def test_every_old_name_has_a_removal_release():
    """CONTRIBUTING.md "Old names": code-only names go at the next minor release, names a saved run can hold later."""
    names = migration.old_names()
    assert len(names) == len(set(names))
    assert all(migration.removal_release(n) in (migration.CODE_NAMES_UNTIL, migration.SAVED_NAMES_UNTIL) for n in names)
    assert migration.removal_release("tcsm.batch") == migration.CODE_NAMES_UNTIL
    assert migration.removal_release("ProbabilityPath.sample") == migration.CODE_NAMES_UNTIL
    assert migration.removal_release("CleanLMConfig") == migration.CODE_NAMES_UNTIL
    assert migration.removal_release("objective.sir_k") == migration.SAVED_NAMES_UNTIL
    assert migration.removal_release("objective.loss (objective.name=dre)") == migration.SAVED_NAMES_UNTIL
    assert migration.removal_release("objective.name=clean_lm") == migration.SAVED_NAMES_UNTIL
    assert migration.removal_release("preset clean-mlm") == migration.SAVED_NAMES_UNTIL
    assert migration.removal_release("tcsm.posttrain.reward.rewards") == migration.SAVED_NAMES_UNTIL


def test_no_old_name_outlives_its_removal_release():
    """Fails once the package's version reaches an old name's removal release: that release must remove it (and this
    test's list of what is due then is the list of what to delete)."""
    import tcsm

    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert f'version = "{tcsm.__version__}"' in pyproject  # the version the rule reads is the package's
    assert migration.overdue(tcsm.__version__) == [], "remove these old names (CONTRIBUTING.md 'Old names')"


def test_overdue_names_the_code_names_first_and_the_saved_names_two_releases_on():
    code = migration.overdue(migration.CODE_NAMES_UNTIL)
    assert "tcsm.batch" in code and "ProbabilityPath.sample" in code and "build_clean_model" in code
    assert "objective.sir_k" not in code and "tcsm.posttrain.reward.rewards" not in code
    assert migration.overdue("0.2.0+local") == code and migration.overdue("0.1.9") == []
    assert migration.overdue(migration.SAVED_NAMES_UNTIL) == migration.old_names()


def test_the_path_samples_old_name_is_listed_and_an_unlisted_rename_is_refused():
    import tcsm.paths  # noqa: F401  (registers ProbabilityPath.sample)

    class Toy:
        def new(self):
            return 1

    with pytest.raises(ValueError, match="Toy.old → new is not in storage/migration.py RENAMED_METHODS"):
        migration.renamed_method(Toy, "old", "new")
    assert not hasattr(Toy, "old")


@pytest.mark.parametrize(
    "old",
    ["tcsm.objectives.clean_lm", "tcsm.builders.sampler", "tcsm.posttrain.dre.builder", "tcsm.posttrain.sft.recipe"],
)
def test_internal_module_paths_no_one_could_name_are_gone(old, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)
