"""builders/diffusion_gemma.py: the `diffusion_gemma` model entry refuses every mismatch with the run in one line
(no directory, another model type, a masked path, another vocabulary, no block length), builds the denoiser that
declares its family's exporter, and that exporter writes the model's own directory with tcsm's keys, which
transformers loads back to the same weights (a tiny random model, nothing downloaded)."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch
from diffusion_gemma_helpers import write_dgemma_dir

from tcsm.builders.diffusion_gemma import (
    DiffusionGemmaExporter,
    DiffusionGemmaModelConfig,
    build_diffusion_gemma,
    native_config,
    write_native,
)
from tcsm.builders.exporters import exporter_of
from tcsm.builders.registry import MODELS, BuildContext
from tcsm.core.errors import ConfigError
from tcsm.models.kinds import kind_of
from tcsm.paths import make_path

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "DiffusionGemmaForBlockDiffusion"):
    pytest.skip("this transformers has no DiffusionGemma", allow_module_level=True)

V, K = 17, 4  # write_dgemma_dir's vocabulary and canvas


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    return write_dgemma_dir(tmp_path_factory.mktemp("dgemma") / "model")


def _node(**kw):
    node = dataclasses.asdict(DiffusionGemmaModelConfig())
    node.pop("name")
    return {**node, **kw}


def _ctx(source="uniform", vocab=V, seq_len=8, block_length=K):
    ctx = BuildContext(config=None, data=SimpleNamespace(vocab_size=vocab, seq_len=seq_len))
    ctx.path = make_path(source, vocab, "linear", block_length=block_length)
    return ctx


def test_the_entry_is_registered_with_its_schema():
    entry = MODELS.get("diffusion_gemma")
    assert entry.builder is build_diffusion_gemma and entry.schema is DiffusionGemmaModelConfig


@pytest.mark.parametrize("node, ctx, message", [
    ({}, {}, "model.name_or_path must name a local DiffusionGemma checkpoint directory"),
    ({"attn_implementation": "flash"}, {}, "model.attn_implementation must be sdpa or eager, got 'flash'"),
    ({}, {"source": "masked"}, "DiffusionGemma is a uniform-source model (no [MASK]): set path.source=uniform"),
    ({}, {"vocab": V + 3}, f"has a vocabulary of {V} tokens but the data has {V + 3}"),
    ({}, {"block_length": None}, f"a DiffusionGemma model denoises canvases of {K} tokens: set path.block_length={K}"),
])  # fmt: skip
def test_a_mismatch_with_the_run_is_one_line(directory, node, ctx, message):
    where = {} if node == {} and ctx == {} else {"name_or_path": str(directory)}
    with pytest.raises(ConfigError) as e:
        build_diffusion_gemma(_node(**where, **node), _ctx(**ctx))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_another_model_type_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ConfigError, match=r"is a 'bert' model, not a DiffusionGemma checkpoint"):
        build_diffusion_gemma(_node(name_or_path=str(tmp_path)), _ctx())


def test_the_model_declares_its_exporter_which_writes_the_models_own_directory(directory, tmp_path):
    model = build_diffusion_gemma(_node(name_or_path=str(directory)), _ctx())
    assert kind_of(model).export == "diffusion_gemma" and kind_of(model).blocks
    exporter = exporter_of(model)
    assert type(exporter) is DiffusionGemmaExporter and not exporter.names_special_ids and exporter.notes({}) == []
    keys = {"kind": "diffusion_gemma", "tcsm": {"config": {"model": {"name_or_path": str(directory)}}}}
    config = native_config(model, keys)
    assert config["model_type"] == "diffusion_gemma" and config["canvas_length"] == K
    assert config["tcsm"]["config"]["model"]["name_or_path"] == "."  # the export directory itself, when read back
    write_native(tmp_path, model, config)
    assert json.loads((tmp_path / "config.json").read_text())["kind"] == "diffusion_gemma"
    back = transformers.DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path)  # no remote code
    mine, theirs = model.hf.state_dict(), back.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k].float()) for k in mine)
    card = "\n".join(exporter.card_lines({"source": "uniform"}))
    assert "DiffusionGemmaForBlockDiffusion.from_pretrained(DIR)" in card and "trust_remote_code=True)" not in card
