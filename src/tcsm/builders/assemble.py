"""A run's objects in build order — data → path → reference → model → target → objective — from a validated run
config (`build_components`), and the objective of a saved run for scoring it (`build_objective_for_checkpoint`).
The frozen reference is loaded once, by the step between the path and the model (`builders.frozen.load_reference`),
for the entries that declare a use of it; nothing here knows a method."""

from __future__ import annotations

import torch

from tcsm.builders.components import Components, build_data, build_objective, build_path, section
from tcsm.builders.frozen import load_reference
from tcsm.builders.lora import keeps_start_adapters, shares_base, with_lora
from tcsm.builders.registry import MODELS, OBJECTIVES, TARGETS, BuildContext
from tcsm.core.errors import ConfigError
from tcsm.core.protocols import TrainerCallback
from tcsm.models.lora import adapters_off

__all__ = ["build_components", "build_objective_for_checkpoint"]


def build_components(cfg, device: torch.device, data=None) -> Components:
    """Build data, path, model (on `device`), target and objective from a validated run config."""
    data = build_data(cfg) if data is None else data
    ctx = BuildContext(config=cfg, device=device, data=data)
    ctx.path = build_path(cfg, data.vocab_size, ctx.seq_len)
    sections = {key: section(cfg, key) for key in ("model", "target", "objective")}
    entries = {"model": MODELS, "target": TARGETS, "objective": OBJECTIVES}
    uses = {key: entries[key].get(name).reference for key, (name, _) in sections.items()}
    listed = [(sections[key][1], use) for key, use in uses.items()]
    # A LoRA run whose reference is its own starting checkpoint reads it as the model with adapters disabled.
    shared = uses["model"] is None and shares_base(cfg, listed)
    # The trainable model's initial weights depend on train.seed alone unless it is built around the reference.
    if not shared:
        load_reference(ctx, listed, own_stream=uses["model"] is None)
    name, node = sections["model"]
    ctx.model = with_lora(MODELS.build(name, node, ctx), cfg).to(device)
    _check_sample_section(cfg, ctx)
    if shared and keeps_start_adapters(cfg, ctx.model):  # the start's adapters stay: the reference is that whole run
        load_reference(ctx, listed, own_stream=True)
    elif shared:
        ctx.reference = adapters_off(ctx.model)
    name, node = sections["target"]
    target = TARGETS.build(name, node, ctx)
    ctx.target = target.to(device) if hasattr(target, "to") else target
    objective = build_objective(cfg, ctx)
    callbacks = [c for c in (ctx.target, objective) if isinstance(c, TrainerCallback)]
    return Components(
        data, ctx.path, ctx.model, ctx.target, objective, ctx, ctx.reference, callbacks
    )


def _check_sample_section(cfg, ctx) -> None:
    """What the `sample:` section says that only the data and model can check, before step 0 (not at the first
    sample, after training)."""
    from tcsm.models.kinds import kind_of

    eos = cfg.sample.get("eos_id") if hasattr(cfg.sample, "get") else getattr(cfg.sample, "eos_id", None)
    if eos is None:
        return
    if not 0 <= int(eos) < int(ctx.path.vocab_size):
        raise ConfigError(f"sample.eos_id={eos} is not a token id of the data's {ctx.path.vocab_size}-token "
                          "vocabulary")  # fmt: skip
    if not kind_of(ctx.model).blocks:
        raise ConfigError(f"sample.eos_id={eos} stops block decoding, and this run's model is a full-sequence model: "
                          "leave sample.eos_id null")  # fmt: skip


def build_objective_for_checkpoint(cfg, model: torch.nn.Module, data, device):
    """The objective a checkpoint's run trained `model` with, for its model-scoring hooks (`evaluate`, `sample`).

    No target is built (ctx.target is None): scoring a model needs only the model and the data, and a teacher
    or reward model would be loaded for nothing; builders accept a missing target (the composed objective then
    uses the data target)."""
    device = torch.device(device)
    ctx = BuildContext(config=cfg, device=device, data=data, model=model)
    ctx.path = build_path(cfg, int(data.vocab_size))
    name, node = section(cfg, "objective")
    use = OBJECTIVES.get(name).reference
    listed = [(node, use if use is not None and use.scoring else None)]
    if shares_base(cfg, listed) and not keeps_start_adapters(cfg, model):
        ctx.reference = adapters_off(model)
    else:
        load_reference(ctx, listed)
    return build_objective(cfg, ctx)
