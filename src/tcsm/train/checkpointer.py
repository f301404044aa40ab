"""Where a run's checkpoints are written and read back (the Trainer's side of `tcsm.storage.checkpoint`).

The Trainer holds a `Checkpointer` built from what a checkpoint contains: the model, its EMA, the optimizer, the
data order (`EpochBatches`), the run config, the processes and the run directory. `save(counters)` writes one step
atomically (whole weights on rank 0, or shards on every rank under FSDP) with the torch / CUDA random states;
`restore(resume)` loads them all back and returns the loop's counters, so a resumed run replays the uninterrupted
one bit for bit. `warm_start` loads another run's weights as a fresh run's starting point."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from omegaconf import OmegaConf

from tcsm.builders.config import load_config, to_dict
from tcsm.builders.loading import check_same_architecture
from tcsm.core.errors import CheckpointError
from tcsm.models.kinds import kind_of
from tcsm.models.lora import fold_adapters, foldable, has_adapters, start_weights
from tcsm.storage.checkpoint import (
    SHARDS,
    load_weights_into,
    read_state,
    read_weights,
    resolve_checkpoint,
    save_checkpoint,
)
from tcsm.train.distributed import barrier

__all__ = ["Checkpointer", "LoopCounters", "warm_start"]


@dataclass
class LoopCounters:
    """What the loop itself carries from one session to the next: its step, training wall time, last evaluation and
    the open logging window (metric sums since the last train row, their step count and wall time; None when the
    checkpoint predates saving it)."""

    step: int
    elapsed: float = 0.0
    last_eval: dict = field(default_factory=dict)
    log_window: dict | None = None


def check_same_tokens(saved_info: dict, data, where: str) -> None:
    """CheckpointError unless `data` has the token ids of the checkpoint's (vocabulary, tokenizer)."""
    from tcsm.builders.components import DataInfo

    if saved_info.get("tokenizer_identity"):
        known = {k: v for k, v in saved_info.items() if k in DataInfo.__dataclass_fields__}
        DataInfo(**known).check_compatible(data, where)


def warm_start(model: torch.nn.Module, where: str, *, ema: bool, data, device: torch.device, seed: int = 0) -> None:
    """Load a trained model's weights (its EMA ones if saved and `ema`) into `model` as a new run's starting point."""
    directory = resolve_checkpoint(where)
    check_same_tokens(read_state(directory)[1].get("data_info") or {}, data, str(directory))
    use_ema = ema and (directory / "ema.safetensors").is_file()
    # A LoRA model takes plain weights as its base, and folds a LoRA run's adapters into it (tcsm.models.lora); adapters
    # on tied weights cannot be folded, so the new run trains them further (its reference is then loaded apart:
    # builders.lora.keeps_start_adapters).
    weights, fold = start_weights(model, read_weights(directory, ema=use_ema, device=device))
    weights = {**fresh_weights(model, weights), **weights}
    load_weights_into(model, weights, str(directory))
    if fold and has_adapters(model) and foldable(model):
        fold_adapters(model, seed)


def fresh_weights(model: torch.nn.Module, weights: dict) -> dict:
    """The model's own initial weights under the prefixes its kind declares `fresh` (a part the start checkpoint may
    lack, such as a step head on a teacher's denoiser) and that `weights` do not hold."""
    fresh = kind_of(model).fresh
    if not fresh:
        return {}
    return {k: v for k, v in model.state_dict().items() if k.startswith(fresh) and k not in weights}


class Checkpointer:
    """Saves and restores one run's training state. Its inputs are explicit: `model` (the unwrapped module whose
    parameters the optimizer holds), `ema` (tcsm.train.ema.EMA or None), `optimizer`, `batches` (the seeded data
    order), `cfg` (the whole run config, stored so the run can be rebuilt), `env` and `parallel` (processes and
    strategy), `data` / `data_info` (checked on resume), `run_dir` (None: nothing is written) and `parts`: the
    run's objects that keep state across steps (`core.protocols.KeepsState`, by name: "target", "objective")."""

    def __init__(self, run_dir, cfg, *, env, parallel, model, ema, optimizer, batches, data, data_info, parts=None):
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.cfg, self.env, self.parallel = cfg, env, parallel
        self.model, self.ema, self.optimizer, self.batches = model, ema, optimizer, batches
        self.data, self.data_info = data, data_info
        self.parts = dict(parts or {})
        self.device = env.device

    @property
    def root(self) -> Path | None:
        """The run's `checkpoints/` directory (None without a run directory)."""
        return None if self.run_dir is None else self.run_dir / "checkpoints"

    def state(self, counters: LoopCounters) -> dict:
        """Everything but the weights; sharded runs keep the optimizer in their shards (`tcsm.train.sharded`)."""
        rng = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available() and self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        return {
            "config": to_dict(self.cfg),
            "data_info": self.data_info.to_dict(),
            "optimizer": None if self.parallel.sharded else self.optimizer.state_dict(),
            "strategy": self.parallel.strategy,
            "lr_schedule": {"step": counters.step},  # lr_at is a pure function of the step
            "batches": self.batches.state_dict(),
            "ema": self.ema.state() if self.ema is not None else None,
            "rng": rng,
            "world_size": self.env.world_size,
            "elapsed_s": counters.elapsed,
            "last_eval": counters.last_eval,
            "log_window": counters.log_window,
            "parts": {name: part.training_state() for name, part in self.parts.items()},
        }

    def save(self, counters: LoopCounters) -> Path | None:
        """Write the checkpoint of step `counters.step` (rank 0; every rank writes its shards under FSDP) and wait
        for it on every rank. Call on every rank, with weights already checked finite."""
        if self.parallel.sharded:
            return self._save_sharded(counters)
        path = None
        if self.env.is_main and self.root is not None:
            path = save_checkpoint(
                self.root,
                counters.step,
                model=self.model,
                ema_model=self.ema.model if self.ema is not None else None,
                state=self.state(counters),
                config_yaml=OmegaConf.to_yaml(self.cfg),
                keep_last=self.cfg.train.keep_last,
            )
        barrier(self.env)
        return path

    def _save_sharded(self, counters: LoopCounters) -> Path | None:
        """Every rank writes its shards into a staging directory; rank 0 completes it (state, whole weights,
        manifest) and renames it into place (tcsm.train.sharded)."""
        from tcsm.train import sharded

        if self.root is None:
            return None
        ema_model = self.ema.model if self.ema is not None else None
        staged = sharded.staging_dir(self.root, counters.step, self.env)
        sharded.write_shards(staged, self.model, self.optimizer, ema_model, self.env)
        consolidated = self.cfg.train.consolidated_weights
        weights = sharded.full_weights(self.model, self.env) if consolidated else None
        ema_weights = sharded.full_weights(ema_model, self.env) if consolidated and ema_model is not None else None
        path = None
        if self.env.is_main:
            path = save_checkpoint(
                self.root,
                counters.step,
                model=weights,
                ema_model=ema_weights,
                state=self.state(counters),
                config_yaml=OmegaConf.to_yaml(self.cfg),
                keep_last=self.cfg.train.keep_last,
                staged=staged,
            )
        barrier(self.env)
        return path

    def _check_same_data(self, saved_info: dict, where: str) -> None:
        """A resume must read the token stream the checkpoint was trained on: the same tokenizer and, for
        prepared shards, the same index (its checksum)."""
        check_same_tokens(saved_info, self.data, where)
        before, now = saved_info.get("index_checksum"), self.data_info.index_checksum
        if before and now and before != now:
            raise CheckpointError(
                f"cannot resume {where!r}: its shards had index sha256 {before[:12]}…, data.path now holds "
                f"{now[:12]}…; resume with the shards it was trained on"
            )

    def restore(self, resume) -> tuple[Path, LoopCounters]:
        """Load the checkpoint `resume` names (True: the run's latest) into the model, EMA, optimizer, data order
        and random streams; returns its directory and the loop's counters. CheckpointError if it cannot be
        resumed exactly (another architecture, seed, batch size or token stream)."""
        if resume is True:
            if self.root is None:
                raise CheckpointError("--resume needs a run directory")
            where = self.run_dir
        else:
            where = Path(resume)
        directory = resolve_checkpoint(where)
        step, state = read_state(directory)
        saved = load_config(base=state["config"])
        check_same_architecture(saved, self.cfg, str(directory))
        for key in ("seed", "batch_size"):
            if saved.train[key] != self.cfg.train[key]:
                raise CheckpointError(
                    f"cannot resume {str(directory)!r} with train.{key}={self.cfg.train[key]}: it was trained with "
                    f"{saved.train[key]}; an exact resume needs the same value"
                )
        self._check_same_data(state.get("data_info") or {}, str(directory))
        if (directory / SHARDS).is_dir():
            self._restore_shards(directory, state)
        else:
            self._restore_whole(directory, state)
        self.batches.load_state_dict(state["batches"])
        for name, part in self.parts.items():
            saved_part = (state.get("parts") or {}).get(name)
            if saved_part is not None:  # a checkpoint from before the part kept state: it starts empty
                part.load_training_state(saved_part)
        rng = state.get("rng", {})
        if "torch" in rng:
            torch.set_rng_state(rng["torch"])
        if "cuda" in rng and self.device.type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"], self.device)
        counters = LoopCounters(
            step=step,
            elapsed=float(state.get("elapsed_s", 0.0)),
            last_eval=dict(state.get("last_eval") or {}),
            log_window=state.get("log_window"),
        )
        return directory, counters

    def _restore_whole(self, directory: Path, state: dict) -> None:
        """Weights, EMA and optimizer of a checkpoint that rank 0 wrote whole (ddp or one process)."""
        if self.parallel.sharded:
            raise CheckpointError(
                f"checkpoint {str(directory)!r} was written whole (train.strategy={state.get('strategy', 'ddp')}); "
                "resume it with that strategy, or start an FSDP run from its weights with train.init_from"
            )
        load_weights_into(self.model, read_weights(directory, device=self.device), str(directory))
        if self.ema is not None:
            if (directory / "ema.safetensors").is_file():
                load_weights_into(
                    self.ema.model, read_weights(directory, ema=True, device=self.device), str(directory)
                )
                self.ema.load_state(state["ema"])
            else:  # EMA switched on at resume: start it from the current weights
                self.ema.model.load_state_dict(self.model.state_dict())
        try:
            self.optimizer.load_state_dict(state["optimizer"])
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(
                f"checkpoint {str(directory)!r}: optimizer state does not fit: {e}"
            ) from None

    def _restore_shards(self, directory: Path, state: dict) -> None:
        """Weights, EMA and optimizer of a sharded checkpoint, re-sharded to this run's processes and strategy."""
        from tcsm.train import sharded

        has_ema = state.get("ema") is not None
        ema_model = self.ema.model if (self.ema is not None and has_ema) else None
        try:
            sharded.read_shards(directory, self.model, self.optimizer, ema_model, self.env)
        except (RuntimeError, ValueError, KeyError) as e:
            raise CheckpointError(f"checkpoint {str(directory)!r}: sharded state does not fit: {e}") from None
        if self.ema is not None:
            if has_ema:
                self.ema.load_state(state["ema"])
            else:  # EMA switched on at resume: start it from the current weights
                with torch.no_grad():
                    for e, p in zip(self.ema.model.parameters(), self.model.parameters()):
                        e.copy_(p)
