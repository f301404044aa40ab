"""`train.lora`: LoRA adapters (PEFT, `tcsm.models.lora`) for any run, and the reference they let a run share.

* `with_lora(model, cfg)`: the built model with adapters when `train.lora.r > 0` (every builder of a run's model goes
  through it: a training run, a resumed one, a checkpoint loaded for eval / export / as a frozen model), with a
  one-line ConfigError for a bad section or targets that match no layer.
* `shares_base(cfg, uses)`: True when the run's frozen reference is the very checkpoint its trainable model starts
  from (`reference.path` and `train.init_from` name the same checkpoint, with the same EMA / raw choice) and only
  the adapters are trained: then the reference is the model with its adapters disabled (`adapters_off`), not a
  second copy of the weights. A model built around the reference (an energy model) never shares it.
"""

from __future__ import annotations

from pathlib import Path

from tcsm.core.errors import CheckpointError, ConfigError

__all__ = ["lora_enabled", "shares_base", "with_lora"]


def lora_enabled(cfg) -> bool:
    lora = cfg.train.get("lora") if hasattr(cfg.train, "get") else getattr(cfg.train, "lora", None)
    return lora is not None and int(lora.r or 0) > 0


def with_lora(model, cfg):
    """`model` with the adapters of `cfg.train.lora` (unchanged when r = 0)."""
    if not lora_enabled(cfg):
        return model
    from tcsm.models.lora import add_adapters

    lora = cfg.train.lora
    if not lora.target_modules:
        from tcsm.models.lora import linear_names

        raise ConfigError(f"train.lora.r={lora.r} needs train.lora.target_modules: a list of the linear layers to "
                          f"adapt, e.g. train.lora.target_modules=[{','.join(linear_names(model)[:2])}]")  # fmt: skip
    if float(lora.dropout) < 0 or float(lora.dropout) >= 1:
        raise ConfigError(f"train.lora.dropout must be in [0, 1), got {lora.dropout}")
    try:
        return add_adapters(model, r=int(lora.r), alpha=float(lora.alpha), dropout=float(lora.dropout),
                            target_modules=list(lora.target_modules), seed=int(cfg.train.seed))  # fmt: skip
    except ValueError as e:
        raise ConfigError(f"train.lora.target_modules: {e}") from None
    except ImportError:
        raise ConfigError("train.lora needs the `peft` package: pip install 'tcsm[hf]'") from None


def shares_base(cfg, uses) -> bool:
    """Whether the run's reference is its trainable model with the adapters disabled (see the module docstring).
    `uses`: (config node, ReferenceUse or None) of the run's entries."""
    declared = [use for _, use in uses if use is not None]
    ref, t = cfg.reference, cfg.train
    if not lora_enabled(cfg) or not declared or any(u.load is not None or "denoiser" not in u.families for u in declared):
        return False
    if not ref.path or not t.init_from or bool(ref.ema) != (t.init_weights == "ema"):
        return False
    from tcsm.storage.checkpoint import resolve_checkpoint

    try:
        return Path(resolve_checkpoint(ref.path)).resolve() == Path(resolve_checkpoint(t.init_from)).resolve()
    except CheckpointError:
        return False


def lora_choice(cfg, model, merge: bool | None) -> bool | None:
    """For `tcsm export`: None when the model has no adapters, else True (merge them) or False (write a PEFT adapter
    directory), from `merge` or else the run's `train.lora.merge`; ConfigError (one line) when neither chooses."""
    from tcsm.models.lora import has_adapters

    if not has_adapters(model):
        if merge is not None:
            raise ConfigError("--merge-lora / --lora-adapter apply to a LoRA run (train.lora.r > 0); this run trained "
                              "all its weights: export it without them")  # fmt: skip
        return None
    choice = merge if merge is not None else cfg.train.lora.get("merge")
    if choice is None:
        raise ConfigError("this run trained LoRA adapters: choose what to export with --merge-lora (the weights with "
                          "the adapters folded in) or --lora-adapter (a PEFT adapter directory), or set "
                          "train.lora.merge")  # fmt: skip
    return bool(choice)


def adapter_base(cfg) -> str | None:
    """What the adapters apply to: the checkpoint the run started from, else the model directory it was built from."""
    return cfg.train.init_from or cfg.model.get("name_or_path")


def write_adapter(directory: Path, model, cfg) -> list[str]:
    """PEFT's adapter directory (adapter_config.json, adapter_model.safetensors) and a README saying how to load it;
    returns notes for the user."""
    from tcsm.models.lora import handle

    peft_model = handle(model)
    base = adapter_base(cfg)
    peft_model.peft_config["default"].base_model_name_or_path = base
    peft_model.save_pretrained(str(directory), save_embedding_layers=False)  # tcsm never resizes the vocabulary
    from tcsm.builders.exporters import exporter_of

    load = exporter_of(model).adapter_base_line(model)  # the family's own loading line
    (directory / "README.md").write_text("\n".join([
        "# LoRA adapter (tcsm)", "",
        (f"Rank {cfg.train.lora.r}, α = {cfg.train.lora.alpha}, layers {list(cfg.train.lora.target_modules)}; "
        f"the base (BASE) is `{base}` (a LoRA run's start that is itself a LoRA run: its merged export)."), "",
        "```python", "from peft import PeftModel", f"base = {load}",
        "model = PeftModel.from_pretrained(base, DIR)   # or .merge_and_unload() for plain weights", "```", "",
    ]), encoding="utf-8")  # fmt: skip
    return [] if base else [("the run names no base model (train.init_from / model.name_or_path): the adapter's "
                            "adapter_config.json has no base_model_name_or_path")]  # fmt: skip


def keeps_start_adapters(cfg, model) -> bool:
    """Whether this LoRA run starts from a LoRA run's adapters that it trains further instead of folding them into the
    base (adapters on tied weights cannot be folded, `models.lora.foldable`): the starting model is then base +
    adapters, and a reference on that checkpoint cannot be this model with its adapters disabled."""
    from tcsm.models.lora import foldable, has_adapters
    from tcsm.storage.checkpoint import read_state, resolve_checkpoint

    if not has_adapters(model) or foldable(model) or not cfg.train.init_from:
        return False
    saved = read_state(resolve_checkpoint(cfg.train.init_from))[1].get("config") or {}
    return int(((saved.get("train") or {}).get("lora") or {}).get("r") or 0) > 0
