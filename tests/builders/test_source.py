"""builders/source.py: the run a recipe starts from is read without its own frozen model, and a run that holds no
config or is not of a family the recipe starts from is refused in one line, before anything is built."""

from __future__ import annotations

import pytest
import torch

from tcsm.builders.registry import model_families
from tcsm.builders.source import source_run
from tcsm.core.errors import CheckpointError
from tcsm.storage.checkpoint import save_checkpoint

FAMILIES = model_families()
#: model.name of the runs that are not diffusion denoisers
NOT_DENOISERS = {name for name, kind in FAMILIES.items() if not kind.is_denoiser}


def _run(root, config):
    weights = {"w": torch.zeros(2)}
    return save_checkpoint(root / "checkpoints", 3, model=weights, state=None if config is None else {"config": config})


def test_a_denoiser_run_is_read_without_its_reference(tmp_path):
    config = {"model": {"name": "denoiser", "activation": "gelu"}, "reference": {"path": "elsewhere"},
              "target": {"name": "data", "teacher": "old-name-of-the-reference"}}  # fmt: skip
    directory = _run(tmp_path, config)
    found, base = source_run(tmp_path, "reward")  # the run directory resolves to its latest checkpoint
    assert found == directory
    assert base == {"model": {"name": "denoiser", "activation": "gelu"}, "target": {"name": "data"}}
    assert config["reference"] == {"path": "elsewhere"}  # the saved config itself is not changed


def test_a_run_without_a_model_name_is_a_denoiser(tmp_path):
    _run(tmp_path, {"train": {"steps": 3}})
    assert source_run(tmp_path, "dre")[1] == {"train": {"steps": 3}}


@pytest.mark.parametrize("name", sorted(NOT_DENOISERS))
def test_a_run_of_another_family_is_refused_in_one_line(tmp_path, name):
    _run(tmp_path, {"model": {"name": name}})
    with pytest.raises(CheckpointError) as e:
        source_run(tmp_path, "preference")
    message = str(e.value)
    assert "\n" not in message and f"(model.name={name}); tcsm finetune preference needs a diffusion denoiser run" in message
    assert FAMILIES[name].description in message


def test_a_recipe_may_accept_other_families(tmp_path):
    _run(tmp_path, {"model": {"name": "causal"}})
    assert source_run(tmp_path, "rl", families=("denoiser", "causal"))[1] == {"model": {"name": "causal"}}
    with pytest.raises(CheckpointError, match="needs an LM run"):
        source_run(tmp_path, "x", families=("mlm",), needs="an LM run")


def test_a_checkpoint_without_a_config_is_refused(tmp_path):
    _run(tmp_path, None)
    with pytest.raises(CheckpointError, match="holds no run config; it was not written by `tcsm train`"):
        source_run(tmp_path, "sft")


def test_not_denoisers_are_exactly_the_families_that_are_not():
    assert NOT_DENOISERS == {n for n, k in FAMILIES.items() if k.family != "denoiser"}
    assert {"energy", "causal", "mlm"} <= NOT_DENOISERS and "hf_denoiser" not in NOT_DENOISERS
