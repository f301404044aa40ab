"""Model builders: `model.name` → an nn.Module (the denoiser, the LM families (models of the data, not diffusion models), Hugging Face adapters).

Each entry validates its config section against its schema and builds from the data's vocabulary and length
(`BuildContext`); the model modules themselves know nothing of configs or registries.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from tcsm.builders.registry import MODELS, BuildContext
from tcsm.core.errors import ConfigError
from tcsm.models.kinds import DENOISER, HF_DENOISER
from tcsm.models.lm import LM_PRESETS, LMConfig
from tcsm.models.lm_families import build_lm, lm_families

__all__ = ["HFModelConfig", "build_denoiser_model"]


# --------------------------------------------------------------------------------------------------- model


def _denoiser_schema() -> type:
    """`model` keys for the denoiser: a preset plus any DenoiserConfig field as an override (null: preset)."""
    from tcsm.models import DenoiserConfig

    hints = typing.get_type_hints(DenoiserConfig)
    from tcsm.models import PRESETS

    fields = [
        ("name", str, "denoiser"),
        (
            "preset",
            str,
            field(default="tiny", metadata={"help": f"architecture preset: {' | '.join(PRESETS)}"}),
        ),
    ]
    for f in dataclasses.fields(DenoiserConfig):
        if f.name in ("vocab_size", "num_states"):  # from the data and the path
            continue
        # A runtime type for OmegaConf, not a hint: hence Optional[...] rather than `X | None`.
        optional = Optional[hints[f.name]]  # noqa: UP045
        fields.append((f.name, optional, field(default=None, metadata={"help": "null: the preset's"})))
    return dataclasses.make_dataclass("DenoiserModelConfig", fields)


@MODELS.register("denoiser", schema=_denoiser_schema(), kind=DENOISER)
def build_denoiser_model(node: dict, ctx: BuildContext):
    """Bidirectional diffusion transformer (tcsm.models.Denoiser): a preset plus overrides; on a block path
    (`path.block_length`) the block diffusion denoiser of that block length (tcsm.models.blocks.BlockDenoiser)."""
    from tcsm.models import PRESETS, build_denoiser
    from tcsm.models.blocks import build_block_denoiser

    preset = node.pop("preset")
    if preset not in PRESETS:
        raise ConfigError(f"unknown model.preset {preset!r}; choose one of {sorted(PRESETS)}")
    overrides = {k: v for k, v in node.items() if v is not None}
    max_len = overrides.get("max_len", PRESETS[preset].get("max_len"))
    if max_len is not None and ctx.seq_len > max_len:
        raise ConfigError(
            f"data sequences have length {ctx.seq_len} but the model allows at most {max_len}; "
            f"set model.max_len={ctx.seq_len} or shorten the data's sequence length"
        )
    block_length = getattr(ctx.path, "block_length", None)
    from tcsm.builders.components import DataInfo

    # A time-blind block denoiser on the uniform source cannot tell a clean block from a noisy one: its bound has no
    # finite integrand (a saved run of one still loads).
    uniform = ctx.path.num_states == ctx.vocab_size
    if block_length is not None and uniform and overrides.get("time_conditioning") is False and not isinstance(
            ctx.data, DataInfo):
        raise ConfigError("a block denoiser on the uniform source needs its time input: set "
                          "model.time_conditioning=true (or use the masked source)")  # fmt: skip
    if overrides.get("step_head_layers") and ctx.path.mask_id is None:
        raise ConfigError("model.step_head_layers: a step head draws a masked step's reveal set jointly; the "
                          "uniform source has none (MATH.md §10): leave it 0 or use path.source=masked")  # fmt: skip
    try:
        if block_length is not None:
            return build_block_denoiser(
                preset, block_length, vocab_size=ctx.vocab_size, num_states=ctx.path.num_states, **overrides
            )
        return build_denoiser(preset, vocab_size=ctx.vocab_size, num_states=ctx.path.num_states, **overrides)
    except ValueError as e:
        raise ConfigError(f"model: {e}") from None


# --------------------------------------------------------------------------------------------------- registry
# `tcsm train` builds these from `model.name: mlm | causal | hollow` plus a preset and overrides.


def _clean_schema(family: str) -> type:
    """`model` keys of an LM family: a size preset plus any LMConfig field (null: the preset's)."""
    hints = typing.get_type_hints(LMConfig)
    fields: list = [
        ("name", str, family),
        ("preset", str, dataclasses.field(default="small", metadata={"help": " | ".join(LM_PRESETS)})),
    ]
    for f in dataclasses.fields(LMConfig):
        if f.name != "vocab_size":  # from the data
            fields.append((f.name, hints[f.name] | None, dataclasses.field(default=None)))
    return dataclasses.make_dataclass(f"{family.title()}LMModelConfig", fields)


def _register_lm_families() -> None:
    helps = {
        "mlm": "BERT-style masked LM of clean data (a parametric p_1 teacher; MATH.md §4)",
        "causal": "autoregressive transformer of clean data with BOS (an AR teacher; MATH.md §4, §5.4)",
        "hollow": "Hollow transformer: all p_1(x^i | x^{≠i}) in one pass (MATH.md §4)",
    }
    for family, text in helps.items():

        def build(node: dict, ctx, family=family):
            node = dict(node)
            preset = node.pop("preset")
            if preset not in LM_PRESETS:
                raise ConfigError(f"unknown model.preset {preset!r}; choose one of {sorted(LM_PRESETS)}")
            fields = {**LM_PRESETS[preset], **{k: v for k, v in node.items() if v is not None}}
            if ctx.seq_len > fields["max_len"]:
                raise ConfigError(
                    f"data sequences have length {ctx.seq_len} but the model allows at most {fields['max_len']}; "
                    f"set model.max_len={ctx.seq_len}"
                )
            try:
                return build_lm(family, fields, vocab_size=ctx.vocab_size)
            except ValueError as e:
                raise ConfigError(f"model: {e}") from None

        MODELS.register(family, build, schema=_clean_schema(family), help=text, overwrite=True,
                        kind=lm_families()[family].model_kind)  # fmt: skip


_register_lm_families()


# --------------------------------------------------------------------------------------------------- registry
# `model.name: hf_mlm | hf_causal` with `name_or_path` (a local directory or a Hub name).


@dataclass
class HFModelConfig:
    name: str = "hf_mlm"
    name_or_path: str | None = field(default=None, metadata={"help": "HF model directory or Hub name"})
    token_ids: list[int] | None = field(default=None, metadata={"help": "HF id of each clean token"})
    symbols: str | None = field(
        default=None, metadata={"help": "tokens of the clean ids in order (null: the data's characters)"}
    )
    special_token_id: int | None = field(
        default=None,
        metadata={"help": "[MASK] (hf_mlm) or BOS (hf_causal) id; null: the tokenizer's / config's"},
    )
    local_files_only: bool = field(default=False, metadata={"help": "never contact the Hub"})


def _cannot_load(where: str, e: BaseException, local_only: bool) -> ConfigError:
    """One line for a Hugging Face model that did not load: a local path that does not exist is named as such (not
    as a malformed Hub repo id or an unreachable Hub), a Hub id as a Hub id."""
    p = Path(where).expanduser()
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    if p.is_file():
        return ConfigError(f"model.name_or_path {where!r} is a file; give a Hugging Face model directory (config.json, weights)")
    if not p.exists():
        path_like = where.startswith(("/", "./", "../", "~", ".\\")) or where.count("/") > 1 or "\\" in where
        if local_only or path_like:
            hub = "" if path_like else " (to download a Hub model set model.local_files_only=false)"
            return ConfigError(f"model.name_or_path {where!r}: no such directory{hub}")
        return ConfigError(
            f"model.name_or_path {where!r} is not a local directory, and as a Hugging Face Hub id it could not be "
            f"loaded: {first}"
        )
    if p.is_dir() and not (p / "config.json").is_file():
        return ConfigError(f"model.name_or_path {where!r} has no config.json: give a Hugging Face model directory "
                           "(config.json, weights, tokenizer)")  # fmt: skip
    if "custom code" in str(e) or "trust_remote_code" in str(e):
        return ConfigError(f"model.name_or_path {where!r} is a model with its own code (config.json auto_map), "
                           "which this model.name does not run: a masked diffusion LM with its own code (LLaDA, "
                           "Dream) is model.name=hf_masked_dlm")  # fmt: skip
    return ConfigError(f"model: cannot load {where!r}: {first}")


def _register_hf() -> None:
    from tcsm.models.hf import HFCausalLM, HFMaskedLM

    def make(cls, special_key: str):
        def build(node: dict, ctx):
            if not node.get("name_or_path"):
                raise ConfigError("model.name_or_path must name a Hugging Face model directory or Hub id")
            symbols = node["symbols"]
            if node["token_ids"] is None and symbols is None:
                symbols = getattr(getattr(ctx.data, "tokenizer", None), "chars", None) or getattr(
                    ctx.data, "chars", None
                )
            try:
                return cls.from_pretrained(
                    node["name_or_path"],
                    token_ids=node["token_ids"],
                    symbols=list(symbols) if symbols is not None else None,
                    local_files_only=node["local_files_only"],
                    **{special_key: node["special_token_id"]},
                )
            except (OSError, ValueError) as e:
                raise _cannot_load(node["name_or_path"], e, node["local_files_only"]) from None

        return build

    causal_schema = dataclasses.make_dataclass(
        "HFCausalModelConfig", [("name", str, "hf_causal")], bases=(HFModelConfig,)
    )
    for name, cls, special, schema, what in (
        ("hf_mlm", HFMaskedLM, "mask_token_id", HFModelConfig, "masked"),
        ("hf_causal", HFCausalLM, "bos_token_id", causal_schema, "causal"),
    ):
        MODELS.register(
            name, make(cls, special), schema=schema, overwrite=True, kind=cls.model_kind,
            help=f"any Hugging Face {what} LM as a tcsm LM (needs `transformers`)",
        )  # fmt: skip


_register_hf()


# --------------------------------------------------------------------------------------------------- registry
# `model.name: hf_denoiser`: the denoiser itself initialised from a pretrained Hugging Face masked or causal LM.


@dataclass
class HFDenoiserModelConfig:
    name: str = "hf_denoiser"
    name_or_path: str | None = field(default=None, metadata={"help": "local Hugging Face model directory"})
    kind: str = field(default="auto", metadata={"help": "auto (from the HF config) | mlm | causal"})
    token_ids: list[int] | None = field(default=None, metadata={"help": "HF id of each clean token"})
    symbols: str | None = field(
        default=None, metadata={"help": "tokens of the clean ids in order (null: the data's characters)"}
    )
    special_token_id: int | None = field(
        default=None, metadata={"help": "HF [MASK] (mlm) or BOS (causal) id; null: the tokenizer's / config's"}
    )
    time_conditioning: bool = field(default=False, metadata={"help": "add t through a zero-initialised path"})
    cond_dim: int = 128
    bidirectional: bool = field(default=True, metadata={"help": "causal LMs: attend both ways (false: keep AR)"})
    local_files_only: bool = field(default=True, metadata={"help": "never contact the Hub"})


def _hf_kind(config, kind: str, where: str) -> str:
    if kind != "auto":
        if kind not in ("mlm", "causal"):
            raise ConfigError(f"model.kind must be auto, mlm or causal, got {kind!r}")
        return kind
    archs = " ".join(getattr(config, "architectures", None) or [])
    if "MaskedLM" in archs:
        return "mlm"
    if "CausalLM" in archs or "LMHead" in archs:
        return "causal"
    raise ConfigError(f"model.name_or_path {where!r}: cannot tell a masked from a causal LM ({archs or 'no architectures'}); set model.kind")


def _hf_token_ids(node: dict, ctx: BuildContext, tok, hf_vocab: int, kind: str, where: str) -> list[int]:
    """Our V clean tokens as HF ids: model.token_ids, else the data's characters (or model.symbols) through the HF
    tokenizer, else ids 0..V−1 when the two vocabularies have the same size."""
    V = int(ctx.vocab_size)
    if node["token_ids"] is not None:
        ids = [int(i) for i in node["token_ids"]]
        if len(ids) != V or len(set(ids)) != V or min(ids) < 0 or max(ids) >= hf_vocab:
            raise ConfigError(f"model.token_ids must be {V} distinct ids in [0, {hf_vocab}) (one per data token)")
        return ids
    symbols = node["symbols"]
    if symbols is None and tok is not None:
        symbols = getattr(getattr(ctx.data, "tokenizer", None), "chars", None) or getattr(ctx.data, "chars", None)
    data_vocab = _data_vocab(getattr(ctx.data, "tokenizer", None))
    if symbols is None and data_vocab is not None and tok is not None:
        return _same_tokenizer(data_vocab, tok.get_vocab(), V, hf_vocab, kind, where)
    if symbols is None:
        if V != hf_vocab:
            raise ConfigError(
                f"the {kind} LM {where!r} has a vocabulary of {hf_vocab} tokens but the data has {V}; a pretrained "
                "model must share the data's vocabulary: use its tokenizer for the data, or map the data's tokens with "
                "model.token_ids / model.symbols"
            )
        return list(range(V))
    if tok is None:
        raise ConfigError(f"model.name_or_path {where!r} has no tokenizer to map the data's characters; set model.token_ids")
    vocab = tok.get_vocab()
    missing = [c for c in symbols if c not in vocab]
    if missing or len(symbols) != V:
        raise ConfigError(
            f"the {kind} LM {where!r} vocabulary does not hold the data's token {missing[0]!r} ({len(missing)} of {V} "
            "missing); a pretrained model must share the data's vocabulary (or set model.token_ids)"
            if missing else f"model.symbols has {len(symbols)} tokens but the data has {V}"
        )  # fmt: skip
    return [int(vocab[c]) for c in symbols]


_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def _architecture_only(where: str, ctx: BuildContext) -> bool:
    """A local folder with a config and no weights, for a run whose weights come from `train.init_from`."""
    from pathlib import Path

    init_from = getattr(getattr(getattr(ctx, "config", None), "train", None), "init_from", None)
    d = Path(where)
    return bool(init_from) and d.is_dir() and not any((d / f).is_file() for f in _WEIGHT_FILES)


def _data_vocab(tokenizer) -> dict[str, int] | None:
    """token → id of the data's tokenizer when it has one with a vocabulary (a `tokenizers` file), else None."""
    hf = getattr(tokenizer, "hf", None)
    try:
        return dict(hf.get_vocab(with_added_tokens=True)) if hf is not None else None
    except (AttributeError, TypeError):
        return None


def _same_tokenizer(data_vocab: dict, model_vocab: dict, V: int, hf_vocab: int, kind: str, where: str) -> list[int]:
    """Ids 0..V−1 when the data's tokenizer is the model's own — every data token is the model tokenizer's token of
    the same id, compared by content, not size: a permuted vocabulary of the same size is another tokenizer —
    and the embedding matrix holds them (it may be padded beyond the tokenizer: GPT-2's 50,304, Qwen's)."""
    by_id = {int(i): t for t, i in data_vocab.items()}
    fix = (f"prepare the data with the model's tokenizer (tcsm prepare --tokenizer {where}), or map the data's "
           "tokens with model.token_ids")  # fmt: skip
    for y in range(V):
        token = by_id.get(y)
        if token is None or model_vocab.get(token) != y:
            theirs = model_vocab.get(token) if token is not None else None
            where_it_is = "absent from" if theirs is None else f"id {theirs} in"
            raise ConfigError(
                f"the data was tokenized with another tokenizer than the {kind} LM {where!r}'s: token {token!r} is id "
                f"{y} in the data and {where_it_is} the model's vocabulary; {fix}"
            )
    if V > hf_vocab:
        raise ConfigError(f"the data has {V} tokens but the {kind} LM {where!r} embeds only {hf_vocab}; {fix}")
    return list(range(V))


@MODELS.register("hf_denoiser", schema=HFDenoiserModelConfig, kind=HF_DENOISER,
                 help="the denoiser initialised from a local Hugging Face masked or causal LM (needs `transformers`); "
                      "with path.block_length, a block denoiser from a causal LM")  # fmt: skip
def build_hf_denoiser(node: dict, ctx: BuildContext):
    from tcsm.builders.components import DataInfo
    from tcsm.models.hf import import_transformers
    from tcsm.models.hf_denoiser import HFDenoiser

    tf = import_transformers()
    where = node.get("name_or_path")
    if not where:
        raise ConfigError("model.name_or_path must name a local Hugging Face model directory")
    local = bool(node["local_files_only"])
    from tcsm.storage.checkpoint import is_export_dir

    if is_export_dir(where):
        raise ConfigError(f"model.name_or_path {where!r} is a tcsm export, not a Hugging Face LM: start from it with "
                          f"train.init_from={where} (its architecture comes with it)")  # fmt: skip
    try:
        config = tf.AutoConfig.from_pretrained(where, local_files_only=local, trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise _cannot_load(where, e, local) from None
    kind = _hf_kind(config, node["kind"], where)
    auto = tf.AutoModelForMaskedLM if kind == "mlm" else tf.AutoModelForCausalLM
    tok = None
    if not isinstance(ctx.data, DataInfo):
        try:
            tok = tf.AutoTokenizer.from_pretrained(where, local_files_only=local, trust_remote_code=False)
        except (OSError, ValueError, TypeError):
            pass
    # A checkpoint (or export) holds the token map, the [MASK] vector and BOS id: only the sizes matter when one is
    # loaded, or when a run starts from one (train.init_from) whose architecture is a folder without weights (an
    # export's base_model/).
    loading = isinstance(ctx.data, DataInfo) or _architecture_only(where, ctx)
    if loading:
        ids, node["special_token_id"] = list(range(int(ctx.vocab_size))), node["special_token_id"] or 0
    else:
        ids = _hf_token_ids(node, ctx, tok, int(config.vocab_size), kind, where)  # before any weight is read
    # Loading a checkpoint needs the architecture only: its weights replace the pretrained ones.
    hf = load_hf_quietly(tf, where, lambda: auto.from_config(config) if loading else auto.from_pretrained(
        where, local_files_only=local, trust_remote_code=False))  # fmt: skip
    special = node["special_token_id"]
    own_mask = getattr(tok, "mask_token_id", None)  # the model's own mask token, where its tokenizer has one
    if own_mask is not None and not 0 <= int(own_mask) < int(config.vocab_size):
        own_mask = None
    if special is None and kind == "mlm":
        special = own_mask
        if special is None and ctx.path.num_states > ctx.vocab_size:
            raise ConfigError(f"{where!r} has no tokenizer with a mask token; set model.special_token_id")
    make = HFDenoiser
    block_length = getattr(ctx.path, "block_length", None)
    if block_length is not None:  # the block denoiser (MATH.md §9) with the model's own KV cache
        from tcsm.models.hf_block import HFBlockDenoiser

        make = functools.partial(HFBlockDenoiser, block_length=block_length)
    try:
        model = make(
            hf, ids, kind=kind, num_states=ctx.path.num_states, special_token_id=special,
            mask_token_id=own_mask if kind == "causal" and not loading else None,
            time_conditioning=node["time_conditioning"], cond_dim=node["cond_dim"], bidirectional=node["bidirectional"],
        )  # fmt: skip
    except ValueError as e:
        raise ConfigError(f"model: {e}") from None
    if ctx.seq_len > model.cfg.max_len:
        raise ConfigError(f"data sequences have length {ctx.seq_len} but {where!r} allows at most {model.cfg.max_len}")
    return model


def load_hf_quietly(tf, where, load):
    """`load()` (a transformers model load) without its progress bars (stderr stays for messages a user must read);
    a load that fails is a one-line ConfigError naming `where`."""
    from safetensors import SafetensorError  # a truncated or corrupt weight file

    tf.utils.logging.disable_progress_bar()
    try:
        return load()
    except (OSError, ValueError, SafetensorError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"model: cannot load {where!r}: {first}") from None
    finally:
        tf.utils.logging.enable_progress_bar()


def save_pretrained_with_config(directory, model, config: dict) -> None:
    """The wrapped model's `save_pretrained` files (without progress bars), config.json then replaced by `config`."""
    import json
    from pathlib import Path

    from tcsm.models.hf import import_transformers

    tf = import_transformers()
    tf.utils.logging.disable_progress_bar()
    try:
        model.hf.save_pretrained(directory)
    finally:
        tf.utils.logging.enable_progress_bar()
    (Path(directory) / "config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
