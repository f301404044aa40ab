"""Run configs (builders/config.py and its parts schema, presets, overrides, validation, help): presets resolve and
`extends` chains apply in order, overrides are typed and unknown keys fail in one line, the checks name the key,
the help lists every schema key, and every moved key is read under its new name."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from tcsm.builders.config import load_config, set_values
from tcsm.builders.help import describe_keys
from tcsm.builders.presets import list_presets, preset_description
from tcsm.builders.schema import FIXED_SECTIONS, RunConfig
from tcsm.core.errors import ConfigError
from tcsm.storage import migration


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_shipped_presets_are_listed_and_described():
    names = list_presets()
    assert "synthetic" in names and "finetune-dre" in names
    assert preset_description("synthetic")  # the first comment line


def test_extends_chains_apply_parent_first(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: synthetic\ntrain: {steps: 7, seed: 3}\n")
    (tmp_path / "b.yaml").write_text(f"extends: {tmp_path / 'a.yaml'}\ntrain: {{steps: 9}}\n")
    base = load_config("synthetic")
    cfg = load_config(str(tmp_path / "b.yaml"))
    assert cfg.train.steps == 9 and cfg.train.seed == 3  # child over parent over grandparent
    assert cfg.data == base.data and cfg.model == base.model  # the rest is the synthetic preset's
    assert "extends" not in cfg


def test_extends_cycle_and_missing_preset_fail_in_one_line(tmp_path):
    (tmp_path / "a.yaml").write_text(f"extends: {tmp_path / 'b.yaml'}\n")
    (tmp_path / "b.yaml").write_text(f"extends: {tmp_path / 'a.yaml'}\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(tmp_path / "a.yaml"))
    assert "cycle" in _one_line(e)
    with pytest.raises(ConfigError) as e:
        load_config("no-such-preset")
    assert "unknown preset 'no-such-preset'" in _one_line(e)


def test_overrides_are_typed_by_yaml_and_the_schema():
    cfg = load_config("synthetic", ["train.steps=3", "optim.lr=1e-3", "optim.betas=[0.8,0.95]", "train.out_dir=null"])
    assert cfg.train.steps == 3 and isinstance(cfg.train.steps, int)
    assert cfg.optim.lr == pytest.approx(1e-3) and list(cfg.optim.betas) == [0.8, 0.95]
    assert cfg.train.out_dir is None
    with pytest.raises(ConfigError) as e:
        load_config("synthetic", ["train.steps=abc"])
    assert "train.steps" in _one_line(e)


@pytest.mark.parametrize("item", ["train.stepz=3", "model.n_layerz=2", "nosection=1"])
def test_unknown_keys_fail_in_one_line(item):
    with pytest.raises(ConfigError) as e:
        load_config("synthetic", [item])
    assert item.split("=")[0].split(".")[0] in _one_line(e)


@pytest.mark.parametrize("item", ["train.steps", "=3", " train.steps=3"])
def test_malformed_overrides_fail(item):
    with pytest.raises(ConfigError) as e:
        load_config("synthetic", [item])
    assert "section.key=value" in _one_line(e)


@pytest.mark.parametrize(
    "item, says",
    [("train.steps=-1", "train.steps must be >= 0"), ("optim.decay=step", "optim.decay must be"),
     ("train.batch_size=10", "multiple of train.micro_batch"), ("path.source=nope", "path.source must be one of"),
     ("eval.split=dev", "eval.split must be"), ("train.ema=1.0", "train.ema must be in [0, 1)")],
)  # fmt: skip
def test_validation_names_the_key(item, says):
    extra = ["train.micro_batch=4"] if "batch_size" in item else []
    with pytest.raises(ConfigError) as e:
        load_config("synthetic", [item, *extra])
    assert says in _one_line(e)


def test_set_values_sets_python_values_and_revalidates():
    cfg = set_values(load_config("synthetic"), {"train.steps": 5, "sample.sir_window": [0.1, 0.9]})
    assert cfg.train.steps == 5 and list(cfg.sample.sir_window) == [0.1, 0.9]
    with pytest.raises(ConfigError):
        set_values(cfg, {"train.steps": -1})


def test_help_lists_every_schema_key():
    listed = {key for key, _, _ in describe_keys("synthetic")}
    sections = [f.default_factory for f in dataclasses.fields(RunConfig) if dataclasses.is_dataclass(f.default_factory)]
    assert len(sections) == 6  # path, optim, train, eval, sample, reference
    for schema in sections:
        section = next(f.name for f in dataclasses.fields(RunConfig) if f.default_factory is schema)
        for sub in dataclasses.fields(schema):  # a nested section (train.lora) is listed key by key
            key = f"{section}.{sub.name}"
            assert key in listed or any(k.startswith(key + ".") for k in listed), key
    assert {key.split(".")[0] for key in listed} == FIXED_SECTIONS
    assert all(help_text for key, _, help_text in describe_keys("synthetic") if key.startswith("train."))


_VALUES = {"sample.sir_k": 3, "sample.sir_window": [0.2, 0.7], "sample.sir_temperature": 0.5,
           "reference.path": "runs/x", "reference.ema": False, "sample.semi_ar_block": 4}  # fmt: skip


@pytest.mark.parametrize("old", sorted(migration.MOVED_KEYS))
def test_every_moved_key_is_read_as_its_new_name_with_one_note(old, capsys, monkeypatch):
    monkeypatch.setattr(migration, "_noted", set())
    new = migration.MOVED_KEYS[old]
    value = _VALUES[new]
    shown = str(value).replace(" ", "")
    cfg = load_config("synthetic", [f"{old}={shown}"])
    got = OmegaConf.to_container(OmegaConf.select(cfg, new)) if isinstance(value, list) else OmegaConf.select(cfg, new)
    assert got == value
    section, key = old.split(".", 1)
    assert key not in cfg[section]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"tcsm: note: {old} is now {new} (read as {new}={value}; in the overrides)"]
    load_config("synthetic", [f"{old}={shown}"])
    assert capsys.readouterr().err == ""  # once per process


def test_saved_configs_are_migrated_silently(capsys, monkeypatch):
    monkeypatch.setattr(migration, "_noted", set())
    saved = {"objective": {"sir_k": 5}, "target": {"teacher": "runs/t", "ema": False}}
    cfg = load_config(base=saved)
    assert cfg.sample.sir_k == 5 and cfg.reference.path == "runs/t" and cfg.reference.ema is False
    assert capsys.readouterr().err == ""
