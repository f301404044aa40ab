"""A Hugging Face diffusion LM directory as the start of a run: a DiffusionGemma checkpoint (`model_type:
diffusion_gemma`) or a masked diffusion LM with its own code (LLaDA-style: `auto_map` and `mask_token_id`), as
transformers wrote it. Its family, noise source, block length and tokenizer come from its own files; the text comes
from the run that reads it (a recipe's records, shards given as overrides). `import_overrides` is the config of the
import (`tcsm train ... train.steps=0` writes it as a run: the same keys a user would type)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tcsm.core.errors import ConfigError

__all__ = ["has_tokenizer", "import_overrides", "load_native_directory", "native_family"]

#: the auto classes a masked diffusion LM directory names in config.json's auto_map (builders.hf_masked's)
_MASKED_AUTO = ("AutoModel", "AutoModelForMaskedLM", "AutoModelForCausalLM")
#: rows of a masked model's import when the command gives no data.seq_len (capped by the model's positions)
DEFAULT_MASKED_LEN = 128


def _config_json(path) -> dict | None:
    f = Path(path) / "config.json"
    try:
        meta = json.loads(f.read_text(encoding="utf-8")) if f.is_file() else None
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and "tcsm" not in meta else None  # a tcsm export reads as a run


def native_family(path) -> str | None:
    """`model.name` of the Hugging Face diffusion LM directory `path` (diffusion_gemma | hf_masked_dlm), or None
    when it is none of them (a tcsm run or export, another model, not a directory)."""
    if not isinstance(path, (str, os.PathLike)) or not Path(path).is_dir():
        return None
    meta = _config_json(path)
    if meta is None:
        return None
    if meta.get("model_type") == "diffusion_gemma":
        return "diffusion_gemma"
    if any(a in (meta.get("auto_map") or {}) for a in _MASKED_AUTO) and meta.get("mask_token_id") is not None:
        return "hf_masked_dlm"
    return None


def has_tokenizer(path) -> bool:
    """Whether the directory holds a tokenizer tcsm reads (tokenizer.json, or a config transformers converts)."""
    return any((Path(path) / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))


def _value(overrides, key: str) -> str | None:
    return next((o.split("=", 1)[1] for o in reversed(list(overrides)) if o.startswith(key + "=")), None)


def import_overrides(path, overrides=()) -> list[str]:
    """key=value overrides (over the schema defaults) of a run importing the directory `path` as it is: its family
    with `model.name_or_path` absolute, its noise source and block length (DiffusionGemma: uniform, its canvas),
    its tokenizer as the data (`data.kind=tokenizer`, rows of `data.seq_len` from `overrides`, else one canvas /
    DEFAULT_MASKED_LEN tokens), and the `model.*` keys of `overrides` (a masked model's trust_remote_code)."""
    family = native_family(path)
    if family is None:
        raise ConfigError(f"{str(path)!r} is not a DiffusionGemma or masked diffusion LM directory")
    where = os.path.abspath(Path(path).expanduser())
    if not has_tokenizer(where):
        raise ConfigError(f"{where!r} has no tokenizer (tokenizer.json): copy the model's tokenizer files into it")
    meta = _config_json(where) or {}
    out = [f"model.name={family}", f"model.name_or_path={where}", "data.kind=tokenizer", f"data.path={where}"]
    seq_len = _value(overrides, "data.seq_len")
    if family == "diffusion_gemma":
        k = int(meta.get("canvas_length") or 0)
        if k < 1:
            raise ConfigError(f"{where!r}: its config.json names no canvas_length (the block length)")
        out += ["path.source=uniform", f"path.block_length={k}", f"data.seq_len={seq_len or k}"]
    else:
        text = meta.get("text_config") if isinstance(meta.get("text_config"), dict) else meta
        positions = text.get("max_position_embeddings") or text.get("max_sequence_length") or DEFAULT_MASKED_LEN
        out += ["path.source=masked", f"data.seq_len={seq_len or min(int(positions), DEFAULT_MASKED_LEN)}"]
    out += [o for o in overrides if o.startswith("model.") and not o.startswith(("model.name=", "model.name_or_path="))]
    return out


def load_native_directory(path, device="cpu", overrides=()):
    """(model, config, data_info) of the directory `path` as it is, for `load_checkpoint` (`tcsm sample | eval |
    export DIR`): the import's config (`import_overrides`) with `overrides` (key=value) on top — `data.*` overrides
    give it text to evaluate on —, its own weights."""
    import torch

    from tcsm.builders.components import DataInfo, build_data, build_path, section
    from tcsm.builders.config import load_config
    from tcsm.builders.registry import MODELS, BuildContext

    overrides = list(overrides)
    cfg = load_config(None, [*import_overrides(path, overrides), *overrides])
    data = build_data(cfg)
    ctx = BuildContext(config=cfg, device=torch.device(device), data=data)
    ctx.path = build_path(cfg, int(data.vocab_size), int(data.seq_len))
    name, node = section(cfg, "model")
    model = MODELS.build(name, node, ctx).to(device).eval()
    return model, cfg, DataInfo.of(data).to_dict()
