"""What a Hugging Face diffusion LM directory is taken for (builders/hf_source.py): its family from its own
config.json, and the import's config — family, absolute path, noise source, block length, tokenizer as data."""

from __future__ import annotations

import json

import pytest

from tcsm.builders.hf_source import import_overrides, native_family
from tcsm.core.errors import ConfigError


def _dir(tmp_path, name, config, tokenizer=True):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    if tokenizer:
        (d / "tokenizer.json").write_text("{}")
    return d


def test_the_family_comes_from_the_directorys_config(tmp_path):
    dg = _dir(tmp_path, "dg", {"model_type": "diffusion_gemma", "canvas_length": 4})
    llada = _dir(tmp_path, "llada", {"model_type": "x", "auto_map": {"AutoModel": "m.M"}, "mask_token_id": 9})
    export = _dir(tmp_path, "export", {"model_type": "diffusion_gemma", "tcsm": {"format": 1}})
    plain = _dir(tmp_path, "gpt2", {"model_type": "gpt2"})
    no_mask = _dir(tmp_path, "nomask", {"auto_map": {"AutoModel": "m.M"}})
    assert [native_family(d) for d in (dg, llada, export, plain, no_mask, tmp_path / "none")] == [
        "diffusion_gemma", "hf_masked_dlm", None, None, None, None]


def test_the_import_reads_source_block_length_and_tokenizer_from_the_directory(tmp_path, monkeypatch):
    _dir(tmp_path, "dg", {"model_type": "diffusion_gemma", "canvas_length": 4})
    _dir(tmp_path, "llada", {"auto_map": {"AutoModel": "m.M"}, "mask_token_id": 9, "max_position_embeddings": 64})
    monkeypatch.chdir(tmp_path)
    dg = import_overrides("dg", ["data.seq_len=12", "model.self_conditioning=true", "optim.lr=1"])
    assert dg == ["model.name=diffusion_gemma", f"model.name_or_path={tmp_path / 'dg'}", "data.kind=tokenizer",
                  f"data.path={tmp_path / 'dg'}", "path.source=uniform", "path.block_length=4", "data.seq_len=12",
                  "model.self_conditioning=true"]  # fmt: skip
    llada = import_overrides("llada", ["model.trust_remote_code=true"])
    assert "path.source=masked" in llada and "data.seq_len=64" in llada and "model.trust_remote_code=true" in llada


def test_a_directory_without_tokenizer_or_canvas_is_one_line(tmp_path):
    _dir(tmp_path, "notok", {"model_type": "diffusion_gemma", "canvas_length": 4}, tokenizer=False)
    _dir(tmp_path, "nocanvas", {"model_type": "diffusion_gemma"})
    with pytest.raises(ConfigError, match="has no tokenizer"):
        import_overrides(tmp_path / "notok")
    with pytest.raises(ConfigError, match="names no canvas_length"):
        import_overrides(tmp_path / "nocanvas")
    with pytest.raises(ConfigError, match="is not a DiffusionGemma or masked diffusion LM directory"):
        import_overrides(tmp_path)
