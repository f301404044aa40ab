"""`model.name: hf_masked_dlm`: a masked diffusion LM directory with its own modeling code (LLaDA, Dream, converted
Llama / Qwen models; `tcsm.models.hf_masked`) as a tcsm masked denoiser, and what `tcsm export` writes for it: the
model's own directory again (its modeling files, safetensors weights under its own names, its config with
`auto_map` and its tokenizer), which `AutoModel.from_pretrained(DIR, trust_remote_code=True)` loads as it loaded
the original, with tcsm's run config under config.json's `tcsm` key so that tcsm reads it back as any export.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from tcsm.builders.exporters import EXPORTERS, Exporter
from tcsm.builders.registry import MODELS, BuildContext
from tcsm.core.errors import ConfigError

__all__ = ["HFMaskedDLMModelConfig", "build_hf_masked_dlm", "native_config", "write_native"]

#: the auto classes such a directory maps to its model, in the order they are tried
AUTO_CLASSES = ("AutoModel", "AutoModelForMaskedLM", "AutoModelForCausalLM")
#: files of a tokenizer that travel with the export (the model's own: its mask id is where the model expects it)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json")  # fmt: skip


@dataclass
class HFMaskedDLMModelConfig:
    name: str = "hf_masked_dlm"
    name_or_path: Optional[str] = field(  # noqa: UP045 (OmegaConf structured configs need Optional)
        default=None, metadata={"help": "local directory of a masked diffusion LM with its modeling code (LLaDA, Dream)"}
    )
    trust_remote_code: bool = field(
        default=False, metadata={"help": "run the directory's own modeling code (required: these models ship it)"}
    )
    mask_token_id: Optional[int] = field(default=None, metadata={"help": "null: the config's mask_token_id"})  # noqa: UP045
    shift_logits: Optional[bool] = field(  # noqa: UP045
        default=None,
        metadata={"help": "output i predicts token i+1 (Dream); null: the config's shift_logits, true for Dream"},
    )
    local_files_only: bool = field(default=True, metadata={"help": "never contact the Hub"})


def _config(where: str, node: dict):
    from tcsm.builders.models import _cannot_load
    from tcsm.models.hf import import_transformers

    if not where:
        raise ConfigError("model.name_or_path must name a local masked diffusion LM directory (config.json, modeling code)")
    if not node["trust_remote_code"]:
        raise ConfigError(f"{where!r} is loaded by its own modeling code: set model.trust_remote_code=true to run it "
                          "(read the directory's *.py first)")  # fmt: skip
    tf = import_transformers()
    local = bool(node["local_files_only"])
    try:
        config = tf.AutoConfig.from_pretrained(where, local_files_only=local, trust_remote_code=True)
    except (OSError, ValueError) as e:
        raise _cannot_load(where, e, local) from None
    auto = [a for a in AUTO_CLASSES if a in (getattr(config, "auto_map", None) or {})]
    mask = node["mask_token_id"] if node["mask_token_id"] is not None else getattr(config, "mask_token_id", None)
    if not auto or mask is None:
        lacks = "no auto_map naming its modeling code" if not auto else "no mask_token_id"
        raise ConfigError(
            f"model.name_or_path {where!r} is not a masked diffusion LM directory (its config.json has {lacks}); "
            "a transformers masked or causal LM starts a denoiser with model.name=hf_denoiser, a DiffusionGemma "
            "checkpoint loads with model.name=diffusion_gemma"
        )
    return tf, config, getattr(tf, auto[0]), int(mask)


def _shift(node: dict, config) -> bool:
    if node["shift_logits"] is not None:
        return bool(node["shift_logits"])
    own = getattr(config, "shift_logits", None)
    return bool(own) if own is not None else str(getattr(config, "model_type", "")).lower() == "dream"


def _check_tokenizer(where: str, ctx: BuildContext) -> None:
    """The data's tokenizer must be the model's own, token by token (a tokenizer of the same size is not enough)."""
    from tcsm.builders.models import _data_vocab, _same_tokenizer

    data_vocab = _data_vocab(getattr(ctx.data, "tokenizer", None))
    f = Path(where) / "tokenizer.json"
    if data_vocab is None or not f.is_file():
        return
    from tokenizers import Tokenizer

    model_vocab = Tokenizer.from_file(str(f)).get_vocab(with_added_tokens=True)
    _same_tokenizer(data_vocab, model_vocab, int(ctx.vocab_size), len(model_vocab), "masked diffusion", where)


@MODELS.register("hf_masked_dlm", schema=HFMaskedDLMModelConfig,
                 help="a masked diffusion LM directory with its own modeling code (LLaDA, Dream), as it is")  # fmt: skip
def build_hf_masked_dlm(node: dict, ctx: BuildContext):
    from tcsm.builders.components import DataInfo
    from tcsm.builders.models import load_hf_quietly
    from tcsm.models.hf_masked import HFMaskedDLM

    where = node.get("name_or_path")
    tf, config, auto, mask = _config(where, node)
    if ctx.path.num_states != ctx.path.vocab_size + 1:
        raise ConfigError(f"{where!r} is a masked diffusion LM: set path.source=masked")
    # A checkpoint (or export) being loaded brings its own weights: only the architecture is built here.
    loading = isinstance(ctx.data, DataInfo)
    if not loading:
        _check_tokenizer(where, ctx)
    hf = load_hf_quietly(tf, where, lambda: auto.from_config(config, trust_remote_code=True) if loading else
                         auto.from_pretrained(where, local_files_only=bool(node["local_files_only"]), trust_remote_code=True))  # fmt: skip
    try:
        model = HFMaskedDLM(hf.float(), int(ctx.vocab_size), mask, shift_logits=_shift(node, config))
    except ValueError as e:
        raise ConfigError(f"model {where!r}: {e}") from None
    if ctx.seq_len > model.cfg.max_len:
        raise ConfigError(f"data sequences have length {ctx.seq_len} but {where!r} allows at most {model.cfg.max_len}")
    return model


def native_config(model, tcsm_keys: dict) -> dict:
    """config.json of the export: the model's own config (its auto_map included) plus tcsm's keys (transformers keeps
    unknown keys as attributes); model.name_or_path "." is the export directory itself when tcsm reads it back."""
    tcsm_keys["tcsm"]["config"]["model"]["name_or_path"] = "."
    own = model.hf.config.to_dict()
    own["mask_token_id"] = model.cfg.mask_token_id
    return {**own, **tcsm_keys}


def write_native(directory: Path, model, config: dict, source: str | None) -> list[str]:
    """The model's `save_pretrained` files (its weights and config, its modeling code), config.json replaced by
    `config`, the modeling and tokenizer files of the `source` directory copied; returns notes for the user."""
    from tcsm.builders.models import save_pretrained_with_config

    save_pretrained_with_config(directory, model, config)
    src = Path(source) if source else None
    if src is None or not src.is_dir():
        return [f"the model directory {source!r} is gone: its tokenizer is not exported"]
    for f in src.iterdir():
        if f.is_file() and (f.suffix == ".py" or f.name in TOKENIZER_FILES):
            shutil.copyfile(f, directory / f.name)
    return []


@EXPORTERS.register
class HFMaskedExporter(Exporter):
    """The model's own directory, loaded by its own modeling code (its tokenizer and special ids are the
    directory's own)."""

    name = "hf_masked_dlm"

    def config(self, ck, model) -> dict:
        return native_config(model, self.native_keys(ck, model))

    def write(self, tmp: Path, ck, model, hf: dict, run_dir) -> list[str]:
        return write_native(tmp, model, hf, ck.config.model.get("name_or_path"))

    def card_lines(self, hf: dict) -> list[str]:
        return [
            "```python",
            "from transformers import AutoModel   # the model's own modeling code, as the directory it came from",
            "model = AutoModel.from_pretrained(DIR, trust_remote_code=True)",
            "logits = model(input_ids=x).logits   # x holds mask_token_id at masked positions",
            "```",
        ]

    def loads_with(self, hf: dict) -> str:
        return "tcsm.from_pretrained or transformers, trust_remote_code=True"  # the directory's own code

    def adapter_base_line(self, model) -> str:
        return "AutoModel.from_pretrained(BASE, trust_remote_code=True)"
