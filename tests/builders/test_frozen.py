"""The one frozen model of a run (`reference.path` / `reference.ema`, loaded by builders.frozen.load_frozen): its
four old names are read as it, with a note where a person wrote them and silently from a saved run; DRE's
objective.reference=ema | previous keep their meaning; a recipe's base never inherits its source run's reference."""

from __future__ import annotations

import pytest

from tcsm.builders.config import load_config
from tcsm.core.errors import ConfigError
from tcsm.storage import migration
from tcsm.storage.migration import without_reference


@pytest.mark.parametrize(
    "preset, old",
    [("finetune-reward", "target.pretrained"), ("parametric-student", "target.teacher"),
     ("distill", "target.teacher"), ("finetune-preference", "objective.reference"),
     ("finetune-dre", "model.reference")],
)  # fmt: skip
def test_old_names_are_read_as_reference_path_with_a_note(preset, old, capsys, monkeypatch):
    monkeypatch.setattr(migration, "_noted", set())  # a note is printed once per process and old key
    extra = ["model.name=energy"] if old.startswith("model.") else []
    ema_key = "target.ema" if old.startswith("target.") else f"{old}_ema"
    cfg = load_config(preset, [*extra, f"{old}=runs/x", f"{ema_key}=false"])
    assert cfg.reference.path == "runs/x" and cfg.reference.ema is False
    section, key = old.split(".")
    assert key not in cfg[section]
    err = capsys.readouterr().err
    assert f"{old} is now reference.path" in err and f"{ema_key} is now reference.ema" in err


def test_a_saved_run_migrates_silently(capsys):
    saved = {"target": {"name": "reward", "pretrained": "runs/pre", "ema": False}}
    cfg = load_config(base=saved)
    assert (cfg.reference.path, cfg.reference.ema) == ("runs/pre", False)
    assert "reference" not in capsys.readouterr().err
    energy = load_config(base={"model": {"name": "energy", "reference": "runs/r", "reference_ema": True}})
    assert energy.reference.path == "runs/r" and "reference" not in energy.model


def test_dre_ema_and_previous_keep_their_meaning(capsys):
    for value in ("ema", "previous"):
        cfg = load_config("finetune-dre", ["objective.strategy=i", "model.name=denoiser", f"objective.reference={value}"])
        assert cfg.objective.reference == value and cfg.reference.path is None
    assert "is now" not in capsys.readouterr().err
    cfg = load_config("finetune-dre", ["objective.strategy=i", "model.name=denoiser", "objective.reference=runs/r"])
    assert cfg.reference.path == "runs/r" and cfg.objective.reference is None


def test_conflicting_names_are_refused():
    with pytest.raises(ConfigError, match="both set"):
        load_config("parametric-student", ["target.teacher=runs/a", "reference.path=runs/b"])
    with pytest.raises(ConfigError, match="both set"):
        load_config(base={"target": {"name": "reward", "pretrained": "a"}, "objective": {"reference": "b"}})
    same = load_config("parametric-student", ["target.teacher=runs/a", "reference.path=runs/a"])
    assert same.reference.path == "runs/a"


def test_a_recipe_base_drops_the_source_runs_reference():
    run = {"reference": {"path": "teacher", "ema": True}, "target": {"name": "parametric", "teacher": "t", "k": 2},
           "objective": {"name": "dre", "reference": "previous"}, "model": {"name": "energy", "reference": "r"}}
    base = without_reference(run)
    assert "reference" not in base and base["target"] == {"name": "parametric", "k": 2}
    assert base["objective"]["reference"] == "previous" and "reference" not in base["model"]
    assert run["target"]["teacher"] == "t"  # the caller's dict is not changed
