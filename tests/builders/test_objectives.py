"""The TCSM objective's builder: the loss options are typed keys of the `objective:` section (listed by `tcsm train
--help`), the untyped `objective.kwargs` form of one is read as it with a note, and an option the loss does not take
is a one-line error."""

from __future__ import annotations

import pytest
import torch

from tcsm.builders.assemble import build_components
from tcsm.builders.config import load_config
from tcsm.core.errors import ConfigError

TINY = ["model.preset=tiny", "train.device=cpu"]


def _objective(*overrides):
    return build_components(load_config("synthetic", [*TINY, *overrides]), torch.device("cpu")).objective


def test_typed_loss_options_reach_the_loss_as_the_kwargs_did(capsys):
    typed = _objective("objective.loss=score", "objective.clamp=-12", "objective.weight_cap=inf")
    assert typed.loss_kwargs == {"clamp": -12.0, "weight_cap": "inf"}
    assert capsys.readouterr().err == ""
    old = _objective("objective.loss=score", "objective.kwargs={clamp: -12, weight_cap: inf}")
    assert old.loss_kwargs["clamp"] == -12 and str(old.loss_kwargs["weight_cap"]) == "inf"
    assert "objective.kwargs.clamp is now objective.clamp" in capsys.readouterr().err


def test_an_option_the_loss_does_not_take_is_one_line():
    with pytest.raises(ConfigError, match="invalid options.*bregman.*distrib"):
        _objective("objective.loss=distrib", "objective.bregman=squared")


def test_train_help_lists_the_loss_options(capsys):
    from tcsm.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert all(f"objective.{key}=" in out for key in ("clamp", "bregman", "tilt", "weight_cap", "paper_scale"))
