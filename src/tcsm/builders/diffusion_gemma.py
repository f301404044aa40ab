"""The family `model.name: diffusion_gemma`, in one module: a DiffusionGemma checkpoint directory as a tcsm block
denoiser (its registry entry, of the kind `DIFFUSION_GEMMA`; the network, which the decoders and their tests use
directly, stays in `tcsm.models.diffusion_gemma` beside its kind), and what `tcsm export` writes for it: the model's
own Hugging Face directory (`DiffusionGemmaForBlockDiffusion.from_pretrained` loads it without tcsm and without remote
code), with tcsm's run config under config.json's `tcsm` key so that tcsm reads it back as it reads any export.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from tcsm.builders.components import build_path
from tcsm.builders.config import load_config
from tcsm.builders.exporters import EXPORTERS, Exporter
from tcsm.builders.registry import MODELS, BuildContext
from tcsm.core.errors import ConfigError
from tcsm.data.synthetic import SYMBOLS
from tcsm.models.diffusion_gemma import DIFFUSION_GEMMA

__all__ = ["DiffusionGemmaModelConfig", "build_diffusion_gemma", "is_native_directory", "load_native", "native_config",
           "write_native"]

MODEL_TYPE = "diffusion_gemma"


@dataclass
class DiffusionGemmaModelConfig:
    name: str = "diffusion_gemma"
    name_or_path: str | None = field(default=None, metadata={"help": "local DiffusionGemma checkpoint directory"})
    self_conditioning: bool = field(
        default=False,
        metadata={"help": "decoding feeds each step's logits back to the next, as the model's generate() does "
                          "(the bound and training never do)"},
    )  # fmt: skip
    attn_implementation: str = field(default="sdpa", metadata={"help": "sdpa | eager"})
    local_files_only: bool = field(default=True, metadata={"help": "never contact the Hub"})


def _hf_config(where: str, local: bool):
    from tcsm.builders.models import _cannot_load
    from tcsm.models.hf import import_transformers

    tf = import_transformers()
    try:
        config = tf.AutoConfig.from_pretrained(where, local_files_only=local, trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise _cannot_load(where, e, local) from None
    if getattr(config, "model_type", None) != MODEL_TYPE:
        raise ConfigError(f"model.name_or_path {where!r} is a {getattr(config, 'model_type', '?')!r} model, not a "
                          f"DiffusionGemma checkpoint (config.json model_type {MODEL_TYPE!r})")  # fmt: skip
    return tf, config


@MODELS.register("diffusion_gemma", schema=DiffusionGemmaModelConfig, kind=DIFFUSION_GEMMA,
                 help="a DiffusionGemma checkpoint (uniform block diffusion; needs `transformers`)")  # fmt: skip
def build_diffusion_gemma(node: dict, ctx: BuildContext):
    from tcsm.builders.components import DataInfo
    from tcsm.builders.models import load_hf_quietly
    from tcsm.models.diffusion_gemma import DiffusionGemmaDenoiser, check_canvas_fit

    where = node.get("name_or_path")
    if not where:
        raise ConfigError("model.name_or_path must name a local DiffusionGemma checkpoint directory")
    if node["attn_implementation"] not in ("sdpa", "eager"):
        raise ConfigError(f"model.attn_implementation must be sdpa or eager, got {node['attn_implementation']!r}")
    local = bool(node["local_files_only"])
    tf, config = _hf_config(where, local)
    text = config.get_text_config()
    V = int(text.vocab_size)
    if ctx.path.num_states != ctx.path.vocab_size:
        raise ConfigError("DiffusionGemma is a uniform-source model (no [MASK]): set path.source=uniform")
    if ctx.vocab_size != V:
        raise ConfigError(f"the DiffusionGemma model {where!r} has a vocabulary of {V} tokens but the data has "
                          f"{ctx.vocab_size}; prepare the data with the model's tokenizer")  # fmt: skip
    k = int(config.canvas_length)
    if getattr(ctx.path, "block_length", None) is None:
        raise ConfigError(f"a DiffusionGemma model denoises canvases of {k} tokens: set path.block_length={k}")
    try:
        check_canvas_fit(ctx.seq_len, k, ctx.path.block_length)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    # A checkpoint (or export) being loaded brings its own weights: only the architecture is built here.
    loading = isinstance(ctx.data, DataInfo)
    config._attn_implementation = node["attn_implementation"]
    cls = tf.DiffusionGemmaForBlockDiffusion
    hf = load_hf_quietly(tf, where, lambda: cls._from_config(config) if loading else cls.from_pretrained(
        where, local_files_only=local, trust_remote_code=False, attn_implementation=node["attn_implementation"]))  # fmt: skip
    try:
        return DiffusionGemmaDenoiser(hf.float(), self_conditioning=node["self_conditioning"])
    except ValueError as e:
        raise ConfigError(f"model: {e}") from None


def native_config(model, tcsm_keys: dict) -> dict:
    """config.json of the export: the model's own Hugging Face config plus tcsm's keys (transformers keeps unknown
    keys as attributes); model.name_or_path "." is the export directory itself when tcsm reads it back."""
    tcsm_keys["tcsm"]["config"]["model"]["name_or_path"] = "."
    return {**model.hf.config.to_dict(), **tcsm_keys}


def write_native(directory: Path, model, config: dict) -> None:
    """The model's `save_pretrained` files (config.json, model.safetensors, generation_config.json), config.json
    then replaced by `config` (the same Hugging Face config with tcsm's keys)."""
    from tcsm.builders.models import save_pretrained_with_config

    save_pretrained_with_config(directory, model, config)


@EXPORTERS.register
class DiffusionGemmaExporter(Exporter):
    """The model's own directory (transformers loads it as it is, no trust_remote_code) with tcsm's keys and the
    run's tokenizer; its own config names its special tokens."""

    name = MODEL_TYPE
    names_special_ids = False

    def config(self, ck, model) -> dict:
        return native_config(model, self.native_keys(ck, model))

    def write_weights(self, tmp: Path, model, hf: dict) -> None:
        write_native(tmp, model, hf)

    def card_lines(self, hf: dict) -> list[str]:
        return [
            "```python",
            "from transformers import DiffusionGemmaForBlockDiffusion   # no trust_remote_code: the model's own files",
            "model = DiffusionGemmaForBlockDiffusion.from_pretrained(DIR)",
            "out = model.generate(prompt_ids, max_new_tokens=N)",
            "```",
            *super().card_lines(hf),
        ]

    def notes(self, hf: dict) -> list[str]:
        return []  # transformers loads its own directory

    def loads_with(self, hf: dict) -> str:
        return "tcsm.from_pretrained or transformers.DiffusionGemmaForBlockDiffusion.from_pretrained"


def is_native_directory(path) -> bool:
    """A DiffusionGemma checkpoint directory as Hugging Face writes it (config.json model_type diffusion_gemma), not
    a tcsm run or export."""
    f = Path(path) / "config.json"
    try:
        meta = json.loads(f.read_text(encoding="utf-8")) if f.is_file() else None
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("model_type") == MODEL_TYPE and "tcsm" not in meta


def load_native(path, device="cpu", overrides=()):
    """(model, config, data_info) of a DiffusionGemma checkpoint directory, for `load_checkpoint` (what `tcsm sample
    DIR` reads): its own weights on the uniform path with its canvas as the block, one canvas as the default length;
    `overrides` (key=value) change the config as for a run."""
    from tcsm.builders.components import DataInfo

    where = str(Path(path).resolve())
    _, config = _hf_config(where, True)
    V, k = int(config.get_text_config().vocab_size), int(config.canvas_length)
    has_tokenizer = any((Path(where) / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json",
                                                              "tokenizer.model"))  # fmt: skip
    if not has_tokenizer and V > len(SYMBOLS):  # without one, ids stand in for text: only a small vocabulary allows it
        raise ConfigError(f"{where!r} has no tokenizer (tokenizer.json, tokenizer_config.json): copy the model's "
                          "tokenizer files into it")  # fmt: skip
    cfg = load_config("synthetic", [f"model.name={MODEL_TYPE}", f"model.name_or_path={where}", "path.source=uniform",
                                    f"path.block_length={k}", f"data.vocab_size={V}", f"data.seq_len={k}",
                                    *overrides])  # fmt: skip
    info = DataInfo(Path(where).name, V, int(cfg.data.seq_len), label=f"{Path(where).name} (DiffusionGemma)")
    ctx = BuildContext(config=cfg, device=device, data=_Sized(V, info.seq_len), path=build_path(cfg, V))
    node = {**{f: getattr(cfg.model, f) for f in DiffusionGemmaModelConfig.__dataclass_fields__}}
    model = build_diffusion_gemma(node, ctx).to(device).eval()
    return model, cfg, dataclasses.asdict(info)


@dataclass
class _Sized:
    """The data's vocabulary and length, for the builder (no data is read)."""

    vocab_size: int
    seq_len: int
