"""The run config's schema: the fixed sections as dataclasses, and the component sections (`model`, `target`,
`objective`, `data`) typed by the schema of the registry entry they name (COMPONENTS), so a new component brings
its own keys without touching this file. `schema_for(raw)` is the structured config OmegaConf validates against."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, OmegaConf

from tcsm.builders.registry import MODELS, OBJECTIVES, TARGETS
from tcsm.core.errors import ConfigError

__all__ = [
    "COMPONENTS",
    "FIXED_SECTIONS",
    "EvalConfig",
    "OptimConfig",
    "PathConfig",
    "ReferenceConfig",
    "RunConfig",
    "SampleConfig",
    "TrainConfig",
    "schema_for",
    "schema_from_signature",
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
    block_length: Optional[int] = field(  # noqa: UP045 (OmegaConf structured configs need Optional)
        default=None,
        metadata={
            "help": "block diffusion: blocks of this many positions, each noised at its own time given the clean "
            "blocks before it (null: the whole sequence is one block; 1: autoregressive)"
        },
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
class LoRAConfig:
    r: int = field(default=0, metadata={"help": "LoRA rank; 0: full-parameter training (tcsm.models.lora)"})
    alpha: float = field(default=16.0, metadata={"help": "LoRA scale α (the update is (α/r) B A)"})
    dropout: float = field(default=0.0, metadata={"help": "dropout on the adapters' input"})
    target_modules: Optional[list[str]] = field(  # noqa: UP045 (OmegaConf structured configs need Optional)
        default=None,
        metadata={"help": "names (or last names) of the linear layers to adapt, or one entry \"re:PATTERN\" (full names "
                          "matching it); needed with r > 0"},
    )
    merge: Optional[bool] = field(  # noqa: UP045
        default=None,
        metadata={"help": "tcsm export: true merged weights, false a PEFT adapter directory; null: --merge-lora or "
                          "--lora-adapter decides"},
    )  # fmt: skip


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
    lora: LoRAConfig = field(default_factory=LoRAConfig, metadata={"help": "LoRA adapters instead of all weights"})
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
    t_max: Optional[float] = field(  # noqa: UP045 (OmegaConf structured configs need Optional)
        default=None,
        metadata={"help": "stop the bound's time reversal at t_max < 1 and add the last step's reconstruction term "
                          "(finite for a denoiser without time input, MATH.md §9; null: up to t = 1)"},
    )  # fmt: skip


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


FIXED_SECTIONS = {f.name for f in dataclasses.fields(RunConfig)}


def schema_for(raw: DictConfig) -> DictConfig:
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


def to_dict(cfg: DictConfig) -> dict:
    """A plain, JSON-serialisable dict of a config."""
    return OmegaConf.to_container(cfg, resolve=True)

