"""Run configs: a typed schema, YAML presets and dotted `key=value` overrides (OmegaConf structured configs).

A run config has fixed sections (`path`, `optim`, `train`, `eval`, `sample`) and component sections (`model`,
`target`, `objective`, `data`) whose `name` (`kind` for data) picks a registry entry; that entry's schema
dataclass then types the rest of the section. So `model.n_layerz=3` or `train.steps=abc` fail in one line
before anything is built, and a new component brings its own keys without touching this file.

Precedence, lowest first: schema defaults < `base` (e.g. a checkpoint's saved config) < preset < overrides.
A preset is a YAML file in `tcsm/configs/` (or any path); its first comment line describes it, and a top-level
`extends: <preset>` key inherits another preset. A YAML file of your own is such a preset: without `extends` it
is applied over the schema defaults (which are not the `synthetic` preset a plain `tcsm train` runs), with
`extends: synthetic` (or any preset) over that preset. `tcsm train --help` shows the synthetic preset's values.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.resources
import inspect
import sys
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import Any, Optional

import yaml
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from tcsm.builders.registry import MODELS, OBJECTIVES, TARGETS, import_plugins
from tcsm.core.errors import ConfigError

__all__ = [
    "COMPONENTS",
    "EvalConfig",
    "OptimConfig",
    "PathConfig",
    "ReferenceConfig",
    "RunConfig",
    "SampleConfig",
    "TrainConfig",
    "describe_keys",
    "list_presets",
    "load_config",
    "preset_description",
    "to_dict",
]


@dataclass
class PathConfig:
    source: str = field(default="masked", metadata={"help": "masked | uniform (MATH.md §1)"})
    schedule: str = field(
        default="linear", metadata={"help": "α_t: linear | cosine | polynomial | loglinear"}
    )
    schedule_kwargs: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "schedule arguments, e.g. {exponent: 2}"}
    )


@dataclass
class OptimConfig:
    lr: float = field(default=3e-4, metadata={"help": "peak learning rate (AdamW)"})
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99], metadata={"help": "AdamW betas"})
    eps: float = field(default=1e-8, metadata={"help": "AdamW epsilon"})
    weight_decay: float = field(
        default=0.0,
        metadata={"help": "decoupled weight decay on matrices (not on norms, biases, embeddings)"},
    )
    warmup: int = field(default=100, metadata={"help": "linear warm-up steps from 0 to lr"})
    decay: str = field(default="cosine", metadata={"help": "after warm-up: cosine | linear | constant"})
    min_lr_ratio: float = field(
        default=0.1, metadata={"help": "final lr as a fraction of lr (cosine / linear decay)"}
    )
    clip: float = field(
        default=1.0, metadata={"help": "clip the global gradient norm at this value; 0 disables"}
    )


@dataclass
class TrainConfig:
    steps: int = field(default=1000, metadata={"help": "optimizer steps"})
    batch_size: int = field(
        default=64, metadata={"help": "global batch (sequences per optimizer step, summed over all ranks)"}
    )
    micro_batch: int | None = field(
        default=None,
        metadata={
            "help": "sequences per forward pass and per random stream; the rest is gradient accumulation. null = "
            "batch_size / world_size. Fix it to get identical runs for any number of processes"
        },
    )
    seed: int = field(
        default=0, metadata={"help": "seed of the initial weights, the data order and every step's noise"}
    )
    precision: str = field(
        default="auto",
        metadata={"help": "fp32 | bf16 (autocast) | auto (bf16 on GPUs, and on CPU for models 256+ wide)"},
    )
    device: str = field(
        default="auto",
        metadata={"help": "auto | cpu | cuda | cuda:N (under torchrun: each rank's local GPU)"},
    )
    ema: float = field(
        default=0.999,
        metadata={"help": "EMA decay of the weights used for evaluation and sampling; 0 disables"},
    )
    log_every: int = field(default=10, metadata={"help": "steps between metrics.jsonl / TensorBoard rows"})
    eval_every: int = field(
        default=500, metadata={"help": "steps between validation bounds (0: only at the end)"}
    )
    eval_examples: int = field(default=256, metadata={"help": "validation sequences per periodic evaluation"})
    sample_every: int = field(
        default=500, metadata={"help": "steps between logged samples (0: only at the end)"}
    )
    save_every: int = field(default=500, metadata={"help": "steps between checkpoints (0: only at the end)"})
    keep_last: int = field(
        default=3, metadata={"help": "checkpoints kept on disk (older ones are deleted); 0 keeps all"}
    )
    out_dir: str | None = field(default=None, metadata={"help": "run directory; null = runs/<preset>-<time>"})
    init_from: str | None = field(
        default=None,
        metadata={"help": "start from the weights of this checkpoint (fine-tuning); ignored when resuming"},
    )
    init_weights: str = field(default="ema", metadata={"help": "ema | model: which weights init_from loads"})
    progress: bool = field(default=True, metadata={"help": "show a tqdm progress bar"})
    tensorboard: bool = field(
        default=True, metadata={"help": "write TensorBoard scalars when tensorboard is installed"}
    )
    compile: bool = field(default=False, metadata={"help": "torch.compile the model (GPU runs)"})
    strategy: str = field(
        default="ddp",
        metadata={
            "help": "ddp (whole model per rank) | fsdp (FSDP2: parameters, gradients and optimizer state sharded "
            "per transformer block; sharded checkpoints)"
        },
    )
    activation_checkpointing: bool = field(
        default=False, metadata={"help": "recompute each transformer block's activations in the backward pass"}
    )
    cpu_offload: bool = field(
        default=False, metadata={"help": "fsdp on GPUs: keep parameter shards and the optimizer step on the host"}
    )
    consolidated_weights: bool = field(
        default=True,
        metadata={
            "help": "fsdp: also write each checkpoint's whole weights (model.safetensors) from rank 0, for tcsm "
            "sample / eval / export; false writes shards only (read_weights then consolidates on load)"
        },
    )
    logger: str = field(
        default="tensorboard",
        metadata={
            "help": "tensorboard | wandb (tcsm[wandb]; WANDB_MODE=offline needs no network) | jsonl; "
            "metrics.jsonl is always written"
        },
    )
    threads: int | None = field(
        default=None,
        metadata={"help": "CPU threads per process (torch.set_num_threads); null = torch default"},
    )


@dataclass
class EvalConfig:
    split: str = field(default="valid", metadata={"help": "data split: train | valid | test"})
    num_t: int = field(
        default=8, metadata={"help": "time samples per sequence in the likelihood bound (MATH.md §2.4)"}
    )
    batch_size: int = field(default=64, metadata={"help": "sequences per evaluation batch"})
    bound: str | None = field(
        default=None, metadata={"help": "likelihood bound (null: the path's default, MATH.md §2)"}
    )
    max_examples: int | None = field(
        default=None, metadata={"help": "evaluate only the first N sequences (null: the whole split)"}
    )
    seed: int = field(default=1234, metadata={"help": "seed of the bound's Monte Carlo draws"})
    ema: bool = field(default=True, metadata={"help": "evaluate and sample with the EMA weights"})


def _sample_config() -> type:
    """The `sample:` section's schema: how many sequences training logs, and the sampler's keys — `method` and every
    registered sampler's settings (`tcsm.sampling.settings.SampleSettings`), so a new sampler's keys appear here
    and in `tcsm train --help` without an edit. Types are made OmegaConf's (Optional, lists)."""
    import typing

    from tcsm.sampling import settings as sampling_settings

    hints = typing.get_type_hints(sampling_settings.SampleSettings, vars(sampling_settings))

    def omegaconf_type(tp):
        args = typing.get_args(tp)
        if type(None) in args:
            return Optional[omegaconf_type(next(a for a in args if a is not type(None)))]  # noqa: UP045
        if typing.get_origin(tp) is tuple:
            return list[args[0]]
        return tp

    spec = [
        ("num", int, field(default=4, metadata={"help": "sequences sampled and logged at each sample_every"})),
        ("length", Optional[int], field(default=None, metadata={  # noqa: UP045
            "help": "sample length (null: the data's sequence length)"})),
        ("seed", int, field(default=0, metadata={"help": "seed of the logged samples"})),
    ]  # fmt: skip
    for f in dataclasses.fields(sampling_settings.SampleSettings):
        tp = omegaconf_type(hints[f.name])
        default = list(f.default) if isinstance(f.default, tuple) else f.default
        fld = field(default_factory=lambda d=default: list(d), metadata=f.metadata) if isinstance(default, list) \
            else field(default=default, metadata=f.metadata)  # fmt: skip
        spec.append((f.name, tp, fld))
    cls = dataclasses.make_dataclass("SampleConfig", spec, namespace={"__module__": __name__})
    cls.__doc__ = "How the run samples, in training (logged samples) and from `tcsm sample` (whose flags override these)."
    return cls


SampleConfig = _sample_config()


@dataclass
class ReferenceConfig:
    """The frozen model a run is built against (`builders.frozen.load_frozen` loads and checks it): the pre-trained
    model of a reward fine-tune, the teacher of a parametric student or a distillation, the reference of a DRE or
    preference fine-tune or of an energy model."""

    path: Optional[str] = field(  # noqa: UP045 (OmegaConf structured configs need Optional)
        default=None,
        metadata={"help": "run, checkpoints or step_* directory (a distillation teacher: also a HF causal-LM dir)"},
    )
    ema: bool = field(default=True, metadata={"help": "use its EMA weights when it has them"})


@dataclass
class RunConfig:
    description: str = field(default="", metadata={"help": "free text stored with the run"})
    plugins: list[str] = field(
        default_factory=list, metadata={"help": "modules imported first so that their registrations run"}
    )
    # Component sections: typed by the schema of the registry entry they name (see COMPONENTS).
    model: Any = field(default_factory=dict, metadata={"help": "model registry entry and its keys"})
    target: Any = field(default_factory=dict, metadata={"help": "target registry entry and its keys"})
    objective: Any = field(default_factory=dict, metadata={"help": "objective registry entry and its keys"})
    data: Any = field(default_factory=dict, metadata={"help": "data kind and its keys (tcsm.data)"})
    path: PathConfig = field(default_factory=PathConfig, metadata={"help": "probability path"})
    optim: OptimConfig = field(
        default_factory=OptimConfig, metadata={"help": "optimizer and learning-rate schedule"}
    )
    train: TrainConfig = field(default_factory=TrainConfig, metadata={"help": "training loop"})
    eval: EvalConfig = field(default_factory=EvalConfig, metadata={"help": "likelihood evaluation"})
    sample: SampleConfig = field(default_factory=SampleConfig, metadata={"help": "sampling"})
    reference: ReferenceConfig = field(
        default_factory=ReferenceConfig, metadata={"help": "the frozen model the run is built against"}
    )


def schema_from_signature(fn, key: str, name: str) -> type:
    """A config dataclass whose fields are `key` (= name) plus the keyword parameters of `fn`, typed by its
    annotations (Any where missing) — so a builder's own signature validates its config section. A parameter
    annotated `Annotated[type, "help"]` gives its field that help (`--help`, a recipe's flag)."""
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except (NameError, TypeError):  # unresolvable annotations: fall back to untyped fields
        hints = {}
    fields = [(key, str, name)]
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name == key:
            continue
        hint, meta = hints.get(p.name, Any), {}
        if typing.get_origin(hint) is typing.Annotated:  # Annotated[type, "help"]
            hint, *notes = typing.get_args(hint)
            meta = {"help": " ".join(n for n in notes if isinstance(n, str))}
        tp = _omegaconf_type(hint)
        default = p.default if p.default is not p.empty else MISSING
        if isinstance(default, (list, dict)):
            fields.append((p.name, tp, field(default_factory=lambda d=default: copy.deepcopy(d), metadata=meta)))
        else:
            fields.append((p.name, tp, field(default=default, metadata=meta)))
    return dataclasses.make_dataclass(f"{name.title()}Config", fields)


def _omegaconf_type(tp):
    """Map annotations OmegaConf cannot take (X | None, Literal, callables) to ones it can."""
    args = typing.get_args(tp)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        inner = _omegaconf_type(rest[0]) if len(rest) == 1 else Any
        return Optional[inner] if len(rest) < len(args) else inner  # noqa: UP045 (a runtime type, not a hint)
    if tp in (int, float, bool, str, Any):
        return tp
    if origin is list and args and args[0] in (int, float, bool, str):
        return list[args[0]]
    return Any


def _data_schema(kind: str) -> type:
    from tcsm.data import DataError, data_kind

    try:
        builder = data_kind(kind)
    except DataError as e:
        raise ConfigError(f"unknown data.kind {kind!r}: {e}") from None
    return schema_from_signature(builder, "kind", kind)


#: section → (key naming the entry, default entry, name → schema dataclass or None)
COMPONENTS = {
    "model": ("name", "denoiser", lambda name: MODELS.get(name).schema),
    "target": ("name", "data", lambda name: TARGETS.get(name).schema),
    "objective": ("name", "tcsm", lambda name: OBJECTIVES.get(name).schema),
    "data": ("kind", "synthetic", _data_schema),
}

_FIXED_SECTIONS = {f.name for f in dataclasses.fields(RunConfig)}


# --------------------------------------------------------------------------------------------------- presets


def _preset_dir():
    return importlib.resources.files("tcsm") / "configs"


def list_presets() -> list[str]:
    """Names of the YAML presets shipped in tcsm/configs."""
    return sorted(p.name[:-5] for p in _preset_dir().iterdir() if p.name.endswith(".yaml"))


def _preset_text(name_or_path: str) -> tuple[str, str]:
    """(text, label) of a preset name or a YAML path."""
    if name_or_path in list_presets():
        return (_preset_dir() / f"{name_or_path}.yaml").read_text(encoding="utf-8"), name_or_path
    p = FsPath(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        try:
            return p.read_text(encoding="utf-8"), str(p)
        except OSError as e:
            raise ConfigError(f"cannot read config file {str(p)!r}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"config file {str(p)!r} is not a YAML text file (it is not UTF-8 text)") from None
    raise ConfigError(f"unknown preset {name_or_path!r}; choose one of {list_presets()} or give a YAML path")


def preset_description(name: str) -> str:
    """The first comment line of a preset."""
    text, _ = _preset_text(name)
    for line in text.splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""


def _load_preset(name_or_path: str, seen: tuple[str, ...] = ()) -> DictConfig:
    text, label = _preset_text(name_or_path)
    if label in seen:
        raise ConfigError(f"preset {label!r} extends itself (cycle {' -> '.join(seen + (label,))})")
    try:
        node = OmegaConf.create(text) if text.strip() else OmegaConf.create({})
    except (OmegaConfBaseException, yaml.YAMLError) as e:
        raise ConfigError(f"config {label!r} is not valid YAML: {_first_line(e)}") from None
    if not isinstance(node, DictConfig):
        raise ConfigError(f"config {label!r} must be a YAML mapping of sections, got a list")
    parent = node.pop("extends", None)
    if parent is not None:
        node = OmegaConf.merge(_load_preset(str(parent), seen + (label,)), node)
    return node


# --------------------------------------------------------------------------------------------------- loading


def _first_line(e: BaseException) -> str:
    return str(e).strip().split("\n")[0]


def _parse_overrides(overrides: Sequence[str]) -> DictConfig:
    for item in overrides:
        key = item.split("=", 1)[0]
        if "=" not in item or not key or key.strip() != key:
            raise ConfigError(f"override {item!r} is not of the form section.key=value")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except OmegaConfBaseException as e:
        raise ConfigError(f"cannot parse overrides: {_first_line(e)}") from None


def _schema_for(raw: DictConfig) -> DictConfig:
    """The structured config for the component names that `raw` selects."""
    schema = OmegaConf.structured(RunConfig)
    for section, (key, default, schema_of) in COMPONENTS.items():
        node = raw.get(section) if isinstance(raw, DictConfig) else None
        name = node.get(key, default) if isinstance(node, DictConfig) else default
        if not isinstance(name, str):
            raise ConfigError(f"{section}.{key} must be a string, got {name!r}")
        entry_schema = schema_of(name)
        if entry_schema is not None:
            sub = OmegaConf.structured(entry_schema)
            if key not in sub:
                raise TypeError(
                    f"schema {entry_schema.__name__} of {section} {name!r} must have a {key!r} field"
                )
            sub[key] = name
        else:  # no schema: an open section, checked by the builder itself
            sub = OmegaConf.create({key: name})
        schema[section] = sub
    return schema


def _friendly(e: OmegaConfBaseException) -> str:
    key = getattr(e, "full_key", None) or ""
    msg = _first_line(e)
    if isinstance(e, ConfigKeyError):
        hint = ""
        if "Did you mean" in str(e):
            hint = (
                " (did you mean "
                + str(e).split("Did you mean", 1)[1].split("\n")[0].strip(" :?")
                + "?)"
            )
        return f"unknown config key {key!r}{hint}; `tcsm train --help` lists the keys"
    if isinstance(e, ValidationError):
        return f"config key {key!r}: {msg}"
    return f"invalid config{(' at ' + repr(key)) if key else ''}: {msg}"


def _drop_replaced_components(raw: DictConfig, layer: DictConfig) -> DictConfig:
    """A layer that names another component (e.g. `objective.name=x`) starts that section afresh: the keys the
    lower layers set were meant for the previous component."""
    for section, (key, _, _) in COMPONENTS.items():
        new, old = layer.get(section), raw.get(section)
        if (
            isinstance(new, DictConfig)
            and isinstance(old, DictConfig)
            and key in new
            and new[key] != old.get(key)
        ):
            raw = OmegaConf.merge(raw, {})  # a copy
            del raw[section]
    return raw


#: Keys that moved, old → new. A config (YAML, override) that still uses an old key is read as the new one with a
#: one-line note on stderr; a saved run's config is migrated silently, so every existing run still loads.
MOVED_KEYS = {
    "objective.sir_k": "sample.sir_k",
    "objective.sir_window": "sample.sir_window",
    "objective.sir_temperature": "sample.sir_temperature",
    # the one frozen model of a run, four names before
    "target.pretrained": "reference.path",
    "target.teacher": "reference.path",
    "model.reference": "reference.path",
    "objective.reference": "reference.path",
    "target.ema": "reference.ema",
    "model.reference_ema": "reference.ema",
    "objective.reference_ema": "reference.ema",
}

#: old keys whose values listed here keep their meaning in place (objective.reference=ema | previous: strategy
#: (i) of DRE refers to the trainer's own EMA or previous iterate, not to a frozen checkpoint)
KEPT_VALUES = {"objective.reference": ("ema", "previous")}


def without_reference(run_config: dict) -> dict:
    """A run's config (plain dict) without its frozen model (`reference` and every old name of it): the base of a
    recipe that starts from that run and chooses its own reference."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in run_config.items() if k != "reference"}
    for old, new in MOVED_KEYS.items():
        section, key = old.split(".", 1)
        inside = isinstance(out.get(section), dict) and out[section].get(key) not in KEPT_VALUES.get(old, ())
        if new.startswith("reference.") and inside:
            out[section].pop(key, None)
    return out

_noted: set[str] = set()


def _move_keys(layer: DictConfig, label: str | None) -> DictConfig:
    """`layer` with every key of MOVED_KEYS it sets under its new name; a note per old key unless `label` is None."""
    moved = {}
    for old, new in MOVED_KEYS.items():
        value = OmegaConf.select(layer, old, default=_ABSENT)
        if value is _ABSENT or value in KEPT_VALUES.get(old, ()):
            continue
        if value is None:  # unset under its old name: nothing to carry over
            moved[old] = (None, None)
            continue
        there = OmegaConf.select(layer, new, default=_ABSENT)
        if there is not _ABSENT and there != value:
            raise ConfigError(f"{old} (the old name of {new}) and {new} are both set, to different values")
        earlier = next((v for n, v in moved.values() if n == new), _ABSENT)
        if earlier is not _ABSENT and earlier != value:
            raise ConfigError(f"{old} and another old name of {new} are both set, to different values")
        moved[old] = (new, value)
    if not moved:
        return layer
    layer = OmegaConf.merge(layer, {})  # a copy: presets are cached by nobody, but callers may reuse a base
    for old, (new, value) in moved.items():
        section, key = old.split(".", 1)
        del layer[section][key]
        if new is None:
            continue
        OmegaConf.update(layer, new, value, force_add=True)
        if label is not None and old not in _noted:
            _noted.add(old)
            sys.stderr.write(f"tcsm: note: {old} is now {new} (read as {new}={_show(value)}; in {label})\n")
    return layer


_ABSENT = object()


def _show(value) -> str:
    return str(OmegaConf.to_container(value) if isinstance(value, (DictConfig, ListConfig)) else value)


def load_config(
    preset: str | None = None, overrides: Sequence[str] = (), base: dict | DictConfig | None = None
) -> DictConfig:
    """Merge schema defaults < base < preset (name or YAML path) < `key=value` overrides; validate; return a
    read-only DictConfig. Raises ConfigError with a one-line message on any mistake."""
    layers: list[DictConfig] = []
    if base is not None:
        layers.append(_move_keys(OmegaConf.create(base) if not isinstance(base, DictConfig) else base, None))
    if preset is not None:
        layers.append(_move_keys(_load_preset(preset), f"config {preset}"))
    layers.append(_move_keys(_parse_overrides(overrides), "the overrides"))
    raw = OmegaConf.create({})
    for layer in layers:
        raw = OmegaConf.merge(_drop_replaced_components(raw, layer), layer)
    if base is None:
        raw = _architecture_of_init_from(raw, layers[-1])
        raw = _max_len_follows_seq_len(raw, layers[-1])
    for section in COMPONENTS:
        if section in raw and not isinstance(raw[section], DictConfig):
            raise ConfigError(f"config section {section!r} must be a mapping of keys, got {raw[section]!r}")
    unknown = sorted(set(raw.keys()) - _FIXED_SECTIONS)
    if unknown:
        raise ConfigError(f"unknown config section {unknown[0]!r}; sections are {sorted(_FIXED_SECTIONS)}")
    import_plugins(raw.get("plugins") or [])
    try:
        cfg = OmegaConf.merge(_schema_for(raw), raw)
    except OmegaConfBaseException as e:
        raise ConfigError(_friendly(e)) from None
    _validate(cfg)
    OmegaConf.set_readonly(cfg, True)
    return cfg


def _architecture_of_init_from(raw: DictConfig, overrides: DictConfig) -> DictConfig:
    """A new run that starts from `train.init_from` (a run, checkpoint or export) builds the model it loads: the
    `model` section is the source's, with only the model keys given as overrides on top (a preset's model keys
    describe a fresh model, not this one; `model.name=` another model starts that section afresh). A saved run or
    a recipe passes its own base config, which already is the source's."""
    where = OmegaConf.select(raw, "train.init_from", default=None)
    if not where:
        return raw
    from tcsm.storage.checkpoint import read_state, resolve_checkpoint

    source = read_state(resolve_checkpoint(where))[1].get("config")
    model = without_reference(source).get("model") if isinstance(source, dict) else None
    if not isinstance(model, dict):
        return raw  # not written by tcsm train: the config's own model (a mismatch is then named at loading)
    given = overrides.get("model")
    given = OmegaConf.to_container(given) if isinstance(given, DictConfig) else {}
    if given.get("name", model.get("name", "denoiser")) != model.get("name", "denoiser"):
        return raw
    raw = OmegaConf.merge(raw, {})  # a copy, whose model section is replaced
    raw["model"] = OmegaConf.merge(OmegaConf.create(model), given)
    return raw


def _max_len_follows_seq_len(raw: DictConfig, overrides: DictConfig) -> DictConfig:
    """`data.seq_len=N` given without `model.max_len` sizes a new model for N: the presets tie the two (the
    synthetic preset's model allows exactly its 32), and a user who changes the data's length means the model's
    too. A saved run's model keeps its own length (its callers pass a base)."""
    seq_len = OmegaConf.select(overrides, "data.seq_len")
    model = overrides.get("model")
    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or (isinstance(model, DictConfig) and "max_len" in model):
        return raw
    if "max_len" not in _schema_for(raw).get("model", {}):  # e.g. a Hugging Face model: its own length
        return raw
    return OmegaConf.merge(raw, {"model": {"max_len": seq_len}})


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


def _validate(cfg: DictConfig) -> None:
    """Checks the schema's types cannot express."""
    from tcsm.paths import PATHS, SCHEDULES

    t, o = cfg.train, cfg.optim
    _check(cfg.path.source in PATHS, f"path.source must be one of {sorted(PATHS)}, got {cfg.path.source!r}")
    _check(
        cfg.path.schedule in SCHEDULES,
        f"path.schedule must be one of {sorted(SCHEDULES)}, got {cfg.path.schedule!r}",
    )
    for key in ("steps", "batch_size", "log_every"):
        _check(t[key] >= 1, f"train.{key} must be >= 1, got {t[key]}")
    for key in ("eval_every", "sample_every", "save_every", "keep_last", "eval_examples"):
        _check(t[key] >= 0, f"train.{key} must be >= 0, got {t[key]}")
    _check(
        t.micro_batch is None or t.micro_batch >= 1, f"train.micro_batch must be >= 1, got {t.micro_batch}"
    )
    _check(
        t.micro_batch is None or t.batch_size % t.micro_batch == 0,
        f"train.batch_size={t.batch_size} must be a multiple of train.micro_batch={t.micro_batch}",
    )
    _check(
        t.precision in ("fp32", "bf16", "auto"),
        f"train.precision must be fp32 | bf16 | auto, got {t.precision!r}",
    )
    dev = t.device
    _check(
        dev in ("auto", "cpu", "cuda") or (dev.startswith("cuda:") and dev[5:].isdigit()),
        f"train.device must be auto | cpu | cuda | cuda:N, got {dev!r}",
    )
    _check(0.0 <= t.ema < 1.0, f"train.ema must be in [0, 1), got {t.ema}")
    _check(
        t.init_weights in ("ema", "model"), f"train.init_weights must be ema | model, got {t.init_weights!r}"
    )
    _check(o.lr > 0, f"optim.lr must be > 0, got {o.lr}")
    _check(
        len(o.betas) == 2 and all(0 <= b < 1 for b in o.betas),
        f"optim.betas must be two numbers in [0, 1), got {list(o.betas)}",
    )
    _check(o.warmup >= 0, f"optim.warmup must be >= 0, got {o.warmup}")
    _check(
        o.decay in ("cosine", "linear", "constant"),
        f"optim.decay must be cosine | linear | constant, got {o.decay!r}",
    )
    _check(0.0 <= o.min_lr_ratio <= 1.0, f"optim.min_lr_ratio must be in [0, 1], got {o.min_lr_ratio}")
    _check(o.clip >= 0, f"optim.clip must be >= 0, got {o.clip}")
    _check(
        cfg.eval.split in ("train", "valid", "test"),
        f"eval.split must be train | valid | test, got {cfg.eval.split!r}",
    )
    _check(cfg.eval.num_t >= 1 and cfg.eval.batch_size >= 1, "eval.num_t and eval.batch_size must be >= 1")
    _check(
        cfg.eval.max_examples is None or cfg.eval.max_examples >= 1,
        f"eval.max_examples must be >= 1 or null (the whole split), got {cfg.eval.max_examples}",
    )
    _check(cfg.sample.num >= 0, f"sample.num must be >= 0, got {cfg.sample.num}")
    from tcsm.sampling.settings import sample_settings

    sample_settings(cfg.sample)  # every registered sampler checks its keys (ConfigError, one line)


def to_dict(cfg: DictConfig) -> dict:
    """A plain, JSON-serialisable dict of a config."""
    return OmegaConf.to_container(cfg, resolve=True)


# --------------------------------------------------------------------------------------------------- help


def _walk(node, prefix: str, schema_type, out: list) -> None:
    fields = (
        {f.name: f for f in dataclasses.fields(schema_type)} if dataclasses.is_dataclass(schema_type) else {}
    )
    for key in node:
        value = node[key]
        full = f"{prefix}{key}"
        f = fields.get(key)
        sub_type = OmegaConf.get_type(node, key)
        if isinstance(value, DictConfig) and dataclasses.is_dataclass(sub_type):
            _walk(value, full + ".", sub_type, out)
        else:
            shown = (
                OmegaConf.to_container(value)
                if isinstance(value, (DictConfig,)) or OmegaConf.is_list(value)
                else value
            )
            out.append((full, shown, (f.metadata.get("help", "") if f is not None else "")))


def describe_keys(preset: str | None = None) -> list[tuple[str, Any, str]]:
    """(dotted key, value, help) for every key of `preset`'s config (None: the schema defaults and default
    component choices), so that help can show what a run of that preset uses."""
    cfg = load_config(preset) if preset is not None else OmegaConf.merge(_schema_for(OmegaConf.create({})), {})
    out: list = []
    for section in cfg:
        value = cfg[section]
        sub_type = OmegaConf.get_type(cfg, section)
        f = {f.name: f for f in dataclasses.fields(RunConfig)}[section]
        if isinstance(value, DictConfig):
            if dataclasses.is_dataclass(sub_type):
                _walk(value, section + ".", sub_type, out)
            else:
                for key in value:
                    out.append((f"{section}.{key}", value[key], f.metadata.get("help", "")))
        else:
            shown = OmegaConf.to_container(value) if OmegaConf.is_list(value) else value
            out.append((section, shown, f.metadata.get("help", "")))
    return out


def set_values(cfg, values: dict):
    """The config with dotted keys set to Python values (no YAML parsing of strings such as reward specs)."""
    if not values:
        return cfg
    d = to_dict(cfg)
    for key, v in values.items():
        node = d
        *parents, leaf = key.split(".")
        for k in parents:
            node = node.setdefault(k, {})
        node[leaf] = v
    return load_config(base=OmegaConf.create(d))
