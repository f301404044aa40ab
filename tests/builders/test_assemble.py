"""The frozen reference is one build step (data → path → reference → model → target → objective): loaded once, with
one set of checks, for the entries that declare a use of it, and handed to them; the trainer never passes it."""

from __future__ import annotations

import pytest
import torch
from train_helpers import restore_torch_threads, tiny  # noqa: F401

from tcsm.builders import frozen
from tcsm.builders.assemble import build_components
from tcsm.builders.config import load_config
from tcsm.builders.registry import MODELS, OBJECTIVES, TARGETS
from tcsm.cli.train import train
from tcsm.core.errors import CheckpointError, ConfigError
from tcsm.recipes.dre.compose import dre_config
from tcsm.recipes.reward.compose import reward_config


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    run = tmp_path_factory.mktemp("reference") / "run"
    with torch.random.fork_rng(devices=[]):
        train(load_config("synthetic", tiny("train.steps=2", "train.eval_every=0")), run, log=lambda s: None)
    return run


def _count_loads(monkeypatch) -> list:
    calls = []
    real = frozen.load_frozen

    def counting(*args, **kwargs):
        calls.append(kwargs.get("role"))
        return real(*args, **kwargs)

    monkeypatch.setattr(frozen, "load_frozen", counting)
    return calls


@pytest.mark.parametrize("strategy", ["i", "ii"])
def test_a_dre_run_loads_its_reference_once(source, strategy, monkeypatch):
    calls = _count_loads(monkeypatch)
    cfg = dre_config(source, values={"objective.strategy": strategy, "train.steps": 1})
    parts = build_components(cfg, torch.device("cpu"))
    assert len(calls) == 1  # the energy model and the DRE objective both declare it: one load
    assert parts.reference is not None and parts.context.reference is parts.reference
    if strategy == "ii":
        assert parts.model.reference is parts.reference  # handed to the model it is built into
    else:
        assert parts.objective.reference is parts.reference


def test_a_reward_run_hands_the_reference_to_its_target(source, monkeypatch):
    calls = _count_loads(monkeypatch)
    cfg = reward_config(source, "finetune-reward", values={"target.reward": "python:math:fsum", "train.steps": 1})
    parts = build_components(cfg, torch.device("cpu"))
    assert calls == ["reference.path (the pre-trained model)"]
    assert parts.target.pretrained is parts.reference


def test_a_run_without_a_use_loads_nothing(source, monkeypatch):
    calls = _count_loads(monkeypatch)
    cfg = load_config("synthetic", tiny(f"reference.path={source}"))
    assert build_components(cfg, torch.device("cpu")).reference is None and calls == []


def test_the_declared_uses_name_the_entries_that_read_it():
    declared = {
        (kind, name)
        for kind, registry in (("model", MODELS), ("target", TARGETS), ("objective", OBJECTIVES))
        for name in registry.names()
        if registry.get(name).reference is not None
    }
    assert declared == {("model", "energy"), ("objective", "dre"), ("objective", "preference"), ("objective", "grpo"),
                        ("target", "reward"), ("target", "parametric"), ("target", "distill"),
                        ("target", "fewstep")}  # fmt: skip
    assert OBJECTIVES.get("preference").reference.scoring and not OBJECTIVES.get("dre").reference.scoring


def test_a_reference_of_the_wrong_kind_is_one_error(source, tmp_path):
    cfg = load_config("synthetic", tiny("target.name=parametric", f"reference.path={source}"))
    with pytest.raises((CheckpointError, ConfigError), match="reference.path \\(the teacher\\)"):
        build_components(cfg, torch.device("cpu"))


@pytest.mark.parametrize("recipe", ["reward", "dre-i"])
def test_loading_the_reference_leaves_the_models_initial_weights_alone(source, recipe):
    """A reference read by a target or an objective is loaded outside the run's random stream (rebuilding its
    model draws initial weights), so the trainable model starts as it would with no reference: fixed-seed runs
    keep their numbers whatever step loads it."""
    from tcsm.builders.components import DataInfo, build_data, build_model_for_checkpoint

    if recipe == "reward":
        cfg = reward_config(source, "finetune-reward", values={"target.reward": "python:math:fsum", "train.steps": 1})
    else:
        cfg = dre_config(source, values={"objective.strategy": "i", "train.steps": 1})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        parts = build_components(cfg, torch.device("cpu"))
        torch.manual_seed(3)
        alone = build_model_for_checkpoint(cfg, DataInfo.of(build_data(cfg)).to_dict(), "cpu")
    assert parts.reference is not None
    for (k, a), (_, b) in zip(parts.model.state_dict().items(), alone.state_dict().items(), strict=True):
        assert torch.equal(a, b), k


def test_a_builders_value_error_is_its_sections_config_error():
    """A registered builder may raise ValueError for an option out of range: the build says which section, in one
    line, so no builder copies a try/except around its constructor."""
    from tcsm.builders.registry import Registry
    from tcsm.core.errors import ConfigError

    widgets = Registry("widget")

    @widgets.register("bad")
    def build_bad(node, ctx):
        raise ValueError("size must be > 0, got -1")

    with pytest.raises(ConfigError, match=r"^widget: size must be > 0, got -1$"):
        widgets.build("bad", {}, None)
