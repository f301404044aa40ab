"""LoRA adapters (PEFT) on any tcsm model: W x + (α/r) B A x on the chosen linear layers, only A and B trained
(Hu et al. 2021; B starts at 0, so the adapted model starts equal to its base).

* `add_adapters(model, ...)` injects PEFT's LoRA layers in place — into `model.hf` for a model that wraps a Hugging
  Face model (so that a saved adapter loads onto that model by itself), else into the model — and freezes every
  other parameter. The model keeps its class, its forward and its declared kind; its state dict names the adapted
  layers' weights `<layer>.base_layer.weight` and the adapters `<layer>.lora_A.default.weight`, ….
* `adapters_off(model)` is the frozen base as a model of its own — the same weights with the adapters disabled —
  so a run's reference that is the checkpoint it starts from is no second copy of the weights.
* `start_weights` / `fold_adapters`: a LoRA run starting from plain weights takes them as its base; one starting
  from a LoRA run's weights folds that run's adapters into the base (W ← W + (α/r) B A) and starts its own at 0.
* `merge(model)` folds the adapters and removes them (plain layers again); `handle(model)` is PEFT's `PeftModel`
  for `save_pretrained` of the adapters alone.
"""

from __future__ import annotations

import contextlib
import re
import warnings

import torch
from torch import Tensor, nn

__all__ = [
    "AdaptersOff",
    "adapters_off",
    "add_adapters",
    "check_foldable",
    "fold_adapters",
    "foldable",
    "handle",
    "has_adapters",
    "linear_names",
    "merge",
    "start_weights",
]  # fmt: skip

_HANDLE = "_tcsm_peft"  # where the PeftModel is kept: a plain attribute, not a submodule (no second state dict entry)


def _root(model: nn.Module) -> nn.Module:
    """The module the adapters go into: the Hugging Face model a tcsm adapter wraps (`.hf`), else the model."""
    inner = getattr(model, "hf", None)
    return inner if isinstance(inner, nn.Module) else model


def linear_names(model: nn.Module) -> list[str]:
    """The distinct last names of the model's linear layers (what `target_modules` may list)."""
    return sorted({name.rsplit(".", 1)[-1] for name, m in _root(model).named_modules() if isinstance(m, nn.Linear)})


def add_adapters(model: nn.Module, *, r: int, alpha: float, dropout: float, target_modules, seed: int) -> nn.Module:
    """`model` with LoRA adapters of rank r on the layers named by `target_modules` (exact names or last names, as
    PEFT matches them; one entry "re:PATTERN": the layers whose full name matches the regular expression), every other
    parameter frozen; A is drawn from a stream seeded by `seed` alone. ValueError (one line) when no layer matches."""
    from peft import LoraConfig, get_peft_model

    names = [str(t) for t in target_modules]
    regex = len(names) == 1 and names[0].startswith("re:")
    if regex:
        try:
            re.compile(names[0][3:])
        except re.error as e:
            raise ValueError(f"{names[0]!r} is not a regular expression: {e}") from None
    config = LoraConfig(r=int(r), lora_alpha=float(alpha), lora_dropout=float(dropout), bias="none",
                        target_modules=names[0][3:] if regex else names)  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        try:
            with warnings.catch_warnings():  # PEFT asks transformers' deprecated is_gradient_checkpointing
                warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
                peft_model = get_peft_model(_root(model), config)
        except ValueError as e:
            if "not found" not in str(e):
                raise
            raise ValueError(f"LoRA target modules {names} match no layer of the model; its linear layers are named "
                             f"{linear_names(model)}") from None  # fmt: skip
    model.__dict__[_HANDLE] = peft_model
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
    return model


def has_adapters(model: nn.Module) -> bool:
    return _HANDLE in getattr(model, "__dict__", {})


def handle(model: nn.Module):
    """PEFT's `PeftModel` around the adapted module (its `save_pretrained` writes the adapter directory)."""
    return model.__dict__[_HANDLE]


def _lora_layers(model: nn.Module):
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


@contextlib.contextmanager
def disabled(model: nn.Module):
    """Within the block `model` computes with its base weights alone (PEFT's `disable_adapter`)."""
    with handle(model).disable_adapter():
        yield


class AdaptersOff(nn.Module):
    """The frozen base of a LoRA model as a model: calls go to the model, in eval mode, with its adapters disabled.
    The model is held as `module` (not a submodule: the view has no parameters or state of its own), and its
    attributes (`cfg`, `vocab_size`, its kind) read through."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.__dict__["module"] = model

    def __getattr__(self, name: str):
        return getattr(self.__dict__["module"], name)

    def forward(self, *args, **kwargs):
        model = self.__dict__["module"]
        was = model.training
        model.eval()
        try:
            with disabled(model):
                return model(*args, **kwargs)
        finally:
            model.train(was)


def adapters_off(model: nn.Module) -> AdaptersOff:
    return AdaptersOff(model)


def start_weights(model: nn.Module, weights: dict[str, Tensor]) -> tuple[dict[str, Tensor], bool]:
    """(weights for `model.load_state_dict`, whether they hold another run's adapters to fold). Plain weights become
    the base of the adapted layers (`x.weight` → `x.base_layer.weight`) and the adapters keep their initial values."""
    if not has_adapters(model) or any("lora_" in k for k in weights):
        return weights, any("lora_" in k for k in weights)
    own = model.state_dict()
    out = {}
    for key, value in own.items():
        if "lora_" in key:
            out[key] = value
        else:
            plain = key.replace(".base_layer.", ".")
            out[key] = weights.get(plain, weights.get(key))
    missing = [k for k, v in out.items() if v is None]
    if missing:  # leave the mismatch to the caller's architecture check
        return weights, False
    return out, False


def check_foldable(model: nn.Module) -> None:
    """ValueError (one line) when an adapted layer's weight is also another layer's (tied weights: DiffusionGemma's
    encoder and decoder share theirs): W + (α/r) B A would change the other layer too, so the adapters cannot be
    folded into the weights; they stay adapters (a PEFT adapter export)."""
    uses: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        uses.setdefault(id(p), []).append(name)
    for layer in _lora_layers(model):
        names = uses.get(id(layer.get_base_layer().weight), [])
        if len(names) > 1:
            raise ValueError(f"the adapted weight {names[0]} is shared with {names[1]} (tied weights): adapters on it "
                             "cannot be folded into the weights; export them with --lora-adapter, or adapt layers "
                             "whose weights are their own")  # fmt: skip


def foldable(model: nn.Module) -> bool:
    """Whether every adapted weight is the layer's own, so its adapters can be folded into it (`check_foldable`)."""
    try:
        check_foldable(model)
    except ValueError:
        return False
    return True


@torch.no_grad()
def fold_adapters(model: nn.Module, seed: int) -> None:
    """W ← W + (α/r) B A in every adapted layer, then the adapters start again at B = 0 (the function is unchanged;
    A is drawn again from a stream seeded by `seed` alone). ValueError when an adapted weight is tied to another."""
    check_foldable(model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        for layer in _lora_layers(model):
            for name in list(layer.lora_A):
                base = layer.get_base_layer()
                base.weight += layer.get_delta_weight(name).to(base.weight.dtype)
                layer.reset_lora_parameters(name, True)


def merge(model: nn.Module) -> nn.Module:
    """Fold the adapters into the base weights and remove them: the model is a plain one again (in place).
    ValueError when an adapted weight is tied to another layer's (`check_foldable`)."""
    if has_adapters(model):
        check_foldable(model)
        handle(model).merge_and_unload()
        del model.__dict__[_HANDLE]
        root = _root(model)
        if "peft_config" in root.__dict__:
            del root.__dict__["peft_config"]
    return model
