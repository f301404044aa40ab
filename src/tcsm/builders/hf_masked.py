"""The family `model.name: hf_masked_dlm`, in one module: a masked diffusion LM directory with its own modeling code
(LLaDA, Dream, converted Llama / Qwen models) as a tcsm masked denoiser — its kind, its network, its registry entry —
and what `tcsm export` writes for it: the model's own directory again (its modeling files, safetensors weights under
its own names, its config with `auto_map` and its tokenizer), which `AutoModel.from_pretrained(DIR,
trust_remote_code=True)` loads as it loaded the original, with tcsm's run config under config.json's `tcsm` key so that
tcsm reads it back as any export.

The network: the models are bidirectional blocks, `forward(input_ids) → logits`, a `mask_token_id` in the config, no
time input — a complete denoiser of the masked path unchanged (MATH.md §1.3: the masked posterior p_{1|t}(· | x_t)
does not depend on t).

`HFMaskedDLM(hf_model, vocab_size, mask_token_id, shift_logits=False)`: x_t [B, L] with ids in {0..V} → logits
[B, L, V]. How tcsm's conventions meet the model's:

* clean tokens are the model's own ids 0..V−1 (the data is tokenized with the model's tokenizer; V may be smaller
  than the embedding matrix, which is often padded);
* tcsm's mask input V becomes the model's `mask_token_id`. When that id lies inside 0..V−1 (LLaDA's <|mdm_mask|>
  is a token of its vocabulary) it is not a clean token: its logit is pushed to `MASK_LOGIT`, so p^θ gives it
  probability 0 to float precision (a finite value, so that p · log p stays 0 in every loss and sampler);
* Dream-style shifted logits (the output at position i predicts token i + 1): with `shift_logits`, the logits of
  position i are the output at i − 1, and position 0 keeps its own output (as Dream's own generation does).

The state dict carries the model's own parameter names (no prefix, tied copies dropped, as `save_pretrained` writes
them), so a checkpoint's weights are the directory's `model.safetensors`.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor, nn

from tcsm.builders.exporters import EXPORTERS, Exporter
from tcsm.builders.registry import MODELS, BuildContext
from tcsm.core.errors import ConfigError
from tcsm.models.config import ModelConfig
from tcsm.models.kinds import ModelKind

__all__ = ["HF_MASKED_DLM", "MASK_LOGIT", "HFMaskedDLM", "HFMaskedDLMConfig", "HFMaskedDLMModelConfig",
           "build_hf_masked_dlm", "native_config", "write_native"]

HF_MASKED_DLM = ModelKind(
    "denoiser", "path", "hf_masked_dlm", "a Hugging Face masked diffusion LM (LLaDA / Dream style, remote code)"
)

#: the auto classes such a directory maps to its model, in the order they are tried
AUTO_CLASSES = ("AutoModel", "AutoModelForMaskedLM", "AutoModelForCausalLM")
#: files of a tokenizer that travel with the export (the model's own: its mask id is where the model expects it)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json")  # fmt: skip


# --------------------------------------------------------------------------------------------------- network

#: the logit of the model's mask id when it lies among the clean ids: probability e^{-1e4} = 0 in float32
MASK_LOGIT = -1.0e4


@dataclass
class HFMaskedDLMConfig(ModelConfig):
    """What the samplers and checks ask a denoiser's `cfg` for."""

    vocab_size: int
    num_states: int
    max_len: int
    mask_token_id: int
    shift_logits: bool = False
    time_conditioning: bool = False


class HFMaskedDLM(nn.Module):
    """x_t [B, L] (ids ≤ V, V = [MASK]), t (ignored) → logits [B, L, V] of a Hugging Face masked diffusion LM."""

    model_kind = HF_MASKED_DLM

    def __init__(self, hf_model: nn.Module, vocab_size: int, mask_token_id: int, *, shift_logits: bool = False,
                 max_len: int | None = None):  # fmt: skip
        super().__init__()
        rows = hf_model.get_input_embeddings().weight.shape[0]
        V, mask = int(vocab_size), int(mask_token_id)
        if not 0 < V <= rows:
            raise ValueError(f"the data has {V} tokens but the model embeds {rows}; use the model's own tokenizer")
        if not 0 <= mask < rows:
            raise ValueError(f"mask_token_id {mask} is outside the model's vocabulary [0, {rows})")
        self.hf = hf_model
        config = getattr(hf_model, "config", None)
        if max_len is None:
            max_len = getattr(config, "max_position_embeddings", None) or getattr(config, "max_sequence_length", None)
        self.cfg = HFMaskedDLMConfig(V, V + 1, int(max_len or 1 << 16), mask, bool(shift_logits))
        self.vocab_size, self.num_states, self.mask_id = V, V + 1, V
        # Names of parameters that are the same tensor as an earlier one (tied embeddings): not saved twice.
        seen: dict[int, str] = {}
        self._tied: dict[str, str] = {}
        for name, p in hf_model.named_parameters(remove_duplicate=False):
            if id(p) in seen:
                self._tied[name] = seen[id(p)]
            else:
                seen[id(p)] = name
        self._register_state_dict_hook(_to_hf_names)
        self._register_load_state_dict_pre_hook(_from_hf_names, with_module=True)

    def input_ids(self, xt: Tensor) -> Tensor:
        """The model's input ids: tcsm's [MASK] (V) → the model's mask_token_id, clean ids unchanged."""
        return torch.where(xt >= self.vocab_size, torch.full_like(xt, self.cfg.mask_token_id), xt)

    def forward(self, xt: Tensor, t: Tensor | None = None) -> Tensor:
        """Logits [B, L, V] of x^i given x_t (MATH.md §1.3); t is not an input of these models."""
        if xt.dim() != 2:
            raise ValueError(f"xt must be a [batch, length] tensor of token ids, got shape {tuple(xt.shape)}")
        if xt.shape[1] > self.cfg.max_len:
            raise ValueError(f"sequence length {xt.shape[1]} exceeds the model's max_len={self.cfg.max_len}")
        out = self.hf(input_ids=self.input_ids(xt))
        logits = (out.logits if hasattr(out, "logits") else out[0])[..., : self.vocab_size].float()
        if self.cfg.shift_logits:  # output i predicts token i + 1
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        if self.cfg.mask_token_id < self.vocab_size:  # the mask token is never a clean value
            logits = logits.clone()
            logits[..., self.cfg.mask_token_id] = MASK_LOGIT
        return logits


def _to_hf_names(module: HFMaskedDLM, state: dict, prefix: str, local_metadata) -> dict:
    """state_dict hook: `hf.<name>` → `<name>`, tied copies dropped (what `save_pretrained` writes)."""
    start = prefix + "hf."
    for key in [k for k in state if k.startswith(start)]:
        value = state.pop(key)
        name = key[len(start):]
        if name not in module._tied:
            state[prefix + name] = value
    return state


def _from_hf_names(module: HFMaskedDLM, state: dict, prefix: str, *args) -> None:
    """load_state_dict pre-hook: `<name>` → `hf.<name>`, each tied copy filled from the weight it is tied to."""
    for key in [k for k in state if k.startswith(prefix) and not k.startswith(prefix + "hf.")]:
        state[prefix + "hf." + key[len(prefix):]] = state.pop(key)
    for name, source in module._tied.items():
        if prefix + "hf." + source in state:
            state.setdefault(prefix + "hf." + name, state[prefix + "hf." + source])


# --------------------------------------------------------------------------------------------------- entry


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


@MODELS.register("hf_masked_dlm", schema=HFMaskedDLMModelConfig, kind=HF_MASKED_DLM,
                 help="a masked diffusion LM directory with its own modeling code (LLaDA, Dream), as it is")  # fmt: skip
def build_hf_masked_dlm(node: dict, ctx: BuildContext):
    from tcsm.builders.components import DataInfo
    from tcsm.builders.models import load_hf_quietly

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


# --------------------------------------------------------------------------------------------------- export


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
