"""`tcsm finetune rl`'s spec: its flags are keys of the grpo schema, its preset marks its runs, and the builder's
one-line errors (group size 1, a reward that is not a number, an estimator the model cannot have)."""

from __future__ import annotations

import argparse
import dataclasses
import sys

import pytest
import torch

from tcsm.builders.config import load_config
from tcsm.builders.registry import OBJECTIVES, BuildContext
from tcsm.cli.recipe import add_recipe_arguments
from tcsm.core.errors import ConfigError
from tcsm.data.synthetic import build_synthetic
from tcsm.models import Denoiser, DenoiserConfig
from tcsm.paths import make_path
from tcsm.recipes.rl.builder import GRPOObjectiveConfig
from tcsm.recipes.spec import flag_field, recipe, recipe_of
from tcsm.targets.base import DataTarget


def test_every_flag_is_a_key_of_the_grpo_schema_and_the_preset_marks_the_run():
    spec = recipe("rl")
    for flag in spec.flags:
        field, _ = flag_field(spec, flag)
        assert field.name == flag.key.rsplit(".", 1)[1]
    cfg = load_config(spec.preset)
    assert cfg.objective.name == "grpo" and recipe_of(cfg) is spec
    p = argparse.ArgumentParser()
    add_recipe_arguments(p, spec)
    opts = {o for a in p._actions for o in a.option_strings}
    assert {"--reward", "--estimator", "--group-size", "-G", "--clip-eps", "--kl-coef", "--upper", "--from"} <= opts
    est = next(a for a in p._actions if "--estimator" in a.option_strings)
    assert list(est.choices) == ["one_step", "elbo", "exact"]
    # the same reward flag as tcsm finetune reward: one command-line style for both families
    q = argparse.ArgumentParser()
    add_recipe_arguments(q, recipe("reward"))
    assert "--reward" in {o for a in q._actions for o in a.option_strings}


def _node(**kw):
    node = {f.name: f.default for f in dataclasses.fields(GRPOObjectiveConfig)}
    node.pop("name")
    node.update({"reward": "python:rl_test_rewards:even_sum", **kw})
    return node


@pytest.fixture
def ctx():
    torch.manual_seed(0)
    data = build_synthetic(vocab_size=4, seq_len=6, num_train=8, num_valid=4, num_test=4)
    cfg = load_config("finetune-rl", ["data.kind=synthetic"])
    c = BuildContext(config=cfg, device=torch.device("cpu"), data=data)
    c.path = make_path("masked", 4, "linear")
    c.model = Denoiser(DenoiserConfig(vocab_size=4, num_states=5, max_len=6, d_model=16, n_layers=1, n_heads=2))
    c.target = DataTarget()  # a training build (scoring a saved run builds no target)
    return c


def nan_reward(x):
    return torch.full((x.shape[0],), float("nan"))


def text_reward(x):
    return ["good"] * x.shape[0]


def test_builder_errors_are_one_line(ctx, monkeypatch):
    build = OBJECTIVES.get("grpo").builder
    monkeypatch.setitem(sys.modules, "rl_test_rewards", sys.modules[__name__])
    with pytest.raises(ConfigError, match="group_size=1: GRPO compares"):
        build(_node(group_size=1), ctx)
    with pytest.raises(ConfigError, match="estimator=exact does not fit this run: the exact likelihood needs an "
                                          "autoregressive model"):  # fmt: skip
        build(_node(estimator="exact"), ctx)
    with pytest.raises(ConfigError, match="objective.reward is not set"):
        build(_node(reward=None), ctx)
    with pytest.raises(ConfigError, match=r"returned \[nan, nan\].*finite number"):
        build(_node(reward="python:rl_test_rewards:nan_reward"), ctx)
    with pytest.raises(ConfigError, match="objective.reward=python:rl_test_rewards:text_reward"):
        build(_node(reward="python:rl_test_rewards:text_reward"), ctx)
    obj = build(_node(estimator="elbo", upper="eubo"), ctx)
    assert obj.estimator.upper == "eubo" and obj.group_size == 8


def even_sum(x):
    return (x.sum(-1) % 2 == 0).float()


def test_an_upper_bound_without_the_elbo_estimate_and_negative_eval_prompts_are_refused(ctx, monkeypatch, tmp_path,
                                                                                           capsys):  # fmt: skip
    build = OBJECTIVES.get("grpo").builder
    monkeypatch.setitem(sys.modules, "rl_test_rewards", sys.modules[__name__])
    with pytest.raises(ConfigError, match="objective.upper=eubo is SPG's upper bound of the elbo estimate; the "
                                          "one_step estimate has none"):  # fmt: skip
        build(_node(estimator="one_step", upper="eubo"), ctx)
    from tcsm.cli import main

    capsys.readouterr()
    assert main(["finetune", "rl", "--from", str(tmp_path / "none"), "--eval-prompts", "-3", "-o",
                 str(tmp_path / "rl")]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--eval-prompts must be >= 0" in err
