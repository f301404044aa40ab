"""Checkpoints → objects: a trained model with its config, path and data (the build layer's loading side).

`tcsm.storage.checkpoint` reads and writes checkpoint directories; this module turns one into a ready model through
the same builders a run uses, so every caller (trainer `init_from`, targets' frozen references, CLI, demos)
loads a model in one way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tcsm.builders.components import build_data, build_model_for_checkpoint, build_path
from tcsm.builders.config import load_config, to_dict
from tcsm.core.errors import CheckpointError
from tcsm.models.kinds import kind_of
from tcsm.models.layers import batch_invariance
from tcsm.storage.checkpoint import load_weights_into, read_state, read_weights, resolve_checkpoint

__all__ = [
    "LoadedCheckpoint",
    "check_same_architecture",
    "config_from_state",
    "load_checkpoint",
    "load_drafter",
    "load_scorer_lm",
    "ngram_drafter",
]


@dataclass
class LoadedCheckpoint:
    """A trained model ready to use, and what is needed to use it."""

    model: torch.nn.Module  # eval mode; EMA weights when available and requested
    config: Any  # the run's DictConfig
    step: int
    directory: Path
    weights: str  # "ema" or "model"
    data_info: dict  # name, vocab_size, seq_len of the data it was trained on

    def build_path(self):
        """The probability path the model was trained with."""
        return build_path(self.config, self.data_info["vocab_size"])

    def build_data(self):
        """The run's DataBundle (reads the data files named in the config)."""
        return build_data(self.config)

    def data_eos_id(self) -> int | None:
        """The end-of-sequence id of the run's data when its rows end with one — a task's or prompted records'
        completion runs to it — else None (also when the data files are gone: nothing to stop at is then known)."""
        from tcsm.data.base import DataError
        from tcsm.data.prompted import PROMPTED_KINDS

        if self.config.data.get("kind") not in (*PROMPTED_KINDS, "task"):
            return None
        try:
            eos = getattr(self.build_data(), "eos_id", None)
        except (DataError, OSError):
            return None
        return None if eos is None else int(eos)

    def __iter__(self):  # `model, config, *_ = load_checkpoint(...)`
        return iter((self.model, self.config, self.step, self.directory))


def load_checkpoint(
    path: str | os.PathLike, device: str | torch.device = "cpu", *, ema: bool = True, overrides=()
) -> LoadedCheckpoint:
    """Load a trained model from a run directory, checkpoints directory or step directory.

    `ema=True` loads the EMA weights when the run kept them. `overrides` (`key=value` strings) may change
    anything but the model section; a model override that changes the architecture raises CheckpointError.
    """
    from tcsm.builders.diffusion_gemma import is_native_directory, load_native
    from tcsm.builders.hf_source import has_tokenizer, load_native_directory, native_family

    if native_family(path) is not None and has_tokenizer(path):  # a Hugging Face diffusion LM directory as it is
        model, config, info = load_native_directory(path, device, overrides)
        return LoadedCheckpoint(model, config, 0, Path(path).resolve(), "model", info)
    if is_native_directory(path):  # a DiffusionGemma checkpoint as Hugging Face wrote it: its own weights
        model, config, info = load_native(path, device, overrides)
        return LoadedCheckpoint(model, config, 0, Path(path).resolve(), "model", info)
    directory = resolve_checkpoint(path)
    step, state = read_state(directory)
    config, data_info = config_from_state(state, overrides, where=str(directory))
    model = build_model_for_checkpoint(config, data_info, device)
    use_ema = ema and (directory / "ema.safetensors").is_file()
    load_weights_into(model, read_weights(directory, ema=use_ema, device=device), str(directory))
    model.eval()
    return LoadedCheckpoint(model, config, step, directory, "ema" if use_ema else "model", data_info)


def config_from_state(state: dict, overrides=(), where: str = "checkpoint"):
    """(config, data_info) stored in a checkpoint's state, with `overrides` applied and checked against it."""
    if "config" not in state or "data_info" not in state:
        raise CheckpointError(f"{where!r} holds no run config; it was not written by `tcsm train`")
    saved = load_config(base=state["config"])
    config = load_config(base=state["config"], overrides=list(overrides)) if overrides else saved
    check_same_architecture(saved, config, where)
    return config, dict(state["data_info"])


def check_same_architecture(saved, requested, where: str) -> None:
    """Raise CheckpointError if the model sections (or the path source, which sets the input alphabet, or its block
    length, which makes the model a block denoiser) differ."""
    def flat(d, prefix=""):
        out = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    def arch(c):
        return {"model": to_dict(c.model), "path": {"source": c.path.source, "block_length": c.path.get("block_length")}}

    a, b = flat(arch(saved)), flat(arch(requested))
    diff = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    if diff:
        k = diff[0]
        raise CheckpointError(
            f"checkpoint {where!r} does not match the config: {k} is {a.get(k)!r} in the checkpoint but "
            f"{b.get(k)!r} in the config"
        )


def load_scorer_lm(path: str, device):
    """A `ScorerLM` from a Hugging Face model directory or a tcsm checkpoint of a causal model."""
    from pathlib import Path

    from tcsm.evaluation.genppl import ScorerLM

    p = Path(path)
    if (p / "config.json").is_file():
        return ScorerLM.from_pretrained(p, device=device)
    ref = load_checkpoint(p, device=device)
    if not kind_of(ref.model).is_autoregressive:
        raise ValueError(f"--scorer {path!r} is neither a Hugging Face model directory nor a causal-LM checkpoint")
    data = ref.build_data()
    return ScorerLM.from_tcsm(ref.model, data.tokenizer, eos_id=data.eos_id, device=device, name=str(p))


def load_drafter(path: str | os.PathLike, device, vocab_size: int, target: LoadedCheckpoint | None = None,
                 settings=None):  # fmt: skip
    """The drafter of speculative decoding (`sample.drafter`, MATH.md §6.4) from a run, checkpoints, step_* or
    exported Hugging Face directory: an autoregressive LM or a full-sequence masked denoiser over the target's
    `vocab_size` tokens; `ngram`: the n-gram table `ngram_drafter` counts for the `target` run under the sampler's
    `settings`. CheckpointError (one line) otherwise."""
    if str(path) == NGRAM:
        if target is None or settings is None:
            raise CheckpointError("sample.drafter=ngram is counted for the target run; this caller passed none")
        return ngram_drafter(target, settings, device)
    try:
        ref = load_checkpoint(path, device=device)
    except FileNotFoundError as e:
        raise CheckpointError(f"sample.drafter={path}: {e}") from None
    kind = kind_of(ref.model)
    if not (kind.is_autoregressive or (kind.is_denoiser and kind.sampler == "path")):
        raise CheckpointError(f"sample.drafter={path} holds {kind.description}; a drafter is an autoregressive LM or a "
                              "full-sequence masked diffusion model")  # fmt: skip
    if kind.is_denoiser and ref.config.path.source != "masked":
        raise CheckpointError(f"sample.drafter={path} is a {ref.config.path.source}-source model; a diffusion drafter "
                              "reads masked positions: train it on the masked path")  # fmt: skip
    if int(ref.data_info["vocab_size"]) != int(vocab_size):
        raise CheckpointError(f"sample.drafter={path} has {ref.data_info['vocab_size']} tokens, the model {vocab_size}: "
                              "a drafter must share the model's tokenizer")  # fmt: skip
    return ref.model


#: `sample.drafter` naming the n-gram drafter (`tcsm.sampling.ngram`) instead of a directory
NGRAM = "ngram"


def ngram_drafter(target: LoadedCheckpoint, settings, device):
    """An n-gram drafter of order `settings.ngram_order` for the `target` run: counted on its training split, or on
    `settings.ngram_draws` sequences drawn from it (an AR run; the draws are seeded, so the drafter is the same each
    time), with q of its longest contexts precomputed at the sampler's temperature and top-p. The counting is paid
    once per command, before the first sample."""
    from tcsm.sampling.ngram import NGramDraft
    from tcsm.targets.ar import sample_ar

    V, L = int(target.data_info["vocab_size"]), int(target.data_info["seq_len"])
    draws = int(settings.ngram_draws)
    if draws:
        if not kind_of(target.model).is_autoregressive:
            raise CheckpointError(f"sample.ngram_draws={draws} counts draws of an AR run; this run holds "
                                  f"{kind_of(target.model).description}: set sample.ngram_draws=0 to count its data")  # fmt: skip
        g = torch.Generator(device=device).manual_seed(0)
        with batch_invariance(settings.batch_invariant):
            chunks = [sample_ar(target.model, min(256, draws - s), L, generator=g, device=device,
                                temperature=settings.temperature, top_p=settings.top_p) for s in range(0, draws, 256)]  # fmt: skip
        sequences = torch.cat(chunks).cpu()
    else:
        sequences = target.build_data().train
        if not isinstance(sequences, torch.Tensor):
            raise CheckpointError("sample.drafter=ngram counts a training split of fixed-length rows; this run's data "
                                  "are records: set sample.ngram_draws to count draws of the model instead")  # fmt: skip
    try:
        drafter = NGramDraft(sequences.long(), V, order=int(settings.ngram_order))
    except ValueError as e:
        raise CheckpointError(f"sample.drafter=ngram: {e}") from None
    drafter.precompute(temperature=settings.temperature, top_p=settings.top_p)
    return drafter
