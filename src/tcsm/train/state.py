"""What a run saves and restores (the Trainer's side of `tcsm.storage.checkpoint`): the state dict of a step (config, data
order, optimizer, EMA, random streams, elapsed time, last evaluation), writing it atomically with the weights,
warm starts, and the exact resume that replays an uninterrupted run bit for bit. `Trainer` inherits it."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from tcsm.builders.config import load_config, to_dict
from tcsm.builders.loading import check_same_architecture
from tcsm.core.errors import CheckpointError
from tcsm.storage.checkpoint import (
    SHARDS,
    load_weights_into,
    read_state,
    read_weights,
    resolve_checkpoint,
    save_checkpoint,
)
from tcsm.train.distributed import all_reduce_mean, barrier

__all__ = ["RunState"]


class RunState:
    """The save / restore half of the Trainer: expects its `cfg`, `model`, `ema`, `optimizer`, `batches`, `env`,
    `device`, `data_info`, `step`, `elapsed`, `last_eval`, `window` (`window_steps`, `window_start`, ...), `run_dir`
    and `check_finite`."""

    @property
    def checkpoint_root(self) -> Path | None:
        return None if self.run_dir is None else self.run_dir / "checkpoints"

    def log_window_state(self) -> dict:
        """The open logging window: metric sums since the last train row, their step count and wall time. Several
        processes: the mean of their sums (a collective: call on every rank), so a replayed row equals the
        uninterrupted one up to rounding; one process: the sums themselves, so it is identical."""
        sums = {k: v.detach().cpu() if isinstance(v, torch.Tensor) else float(v) for k, v in self.window.items()}
        if self.env.distributed:
            sums = all_reduce_mean({k: float(v) for k, v in sums.items()}, self.env)
        return {"steps": self.window_steps, "sums": sums, "elapsed_s": time.perf_counter() - self.window_start}

    def state(self, log_window: dict | None = None) -> dict:
        """Everything but the weights; sharded runs keep the optimizer in their shards (`tcsm.train.sharded`)."""
        rng = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available() and self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        return {
            "config": to_dict(self.cfg),
            "data_info": self.data_info.to_dict(),
            "optimizer": None if self.parallel.sharded else self.optimizer.state_dict(),
            "strategy": self.parallel.strategy,
            "lr_schedule": {"step": self.step},  # lr_at is a pure function of the step
            "batches": self.batches.state_dict(),
            "ema": self.ema.state() if self.ema is not None else None,
            "rng": rng,
            "world_size": self.env.world_size,
            "elapsed_s": self.elapsed,
            "last_eval": self.last_eval,
            "log_window": log_window if log_window is not None else self.log_window_state(),
        }

    def save(self) -> Path | None:
        """Write a checkpoint of the current step (rank 0) and wait for it on every rank."""
        self.check_finite()  # never write weights a non-finite update has corrupted
        if self.parallel.sharded:
            return self._save_sharded()
        path = None
        log_window = self.log_window_state()
        if self.env.is_main and self.checkpoint_root is not None:
            path = save_checkpoint(
                self.checkpoint_root,
                self.step,
                model=self.model,
                ema_model=self.ema.model if self.ema is not None else None,
                state=self.state(log_window),
                config_yaml=OmegaConf.to_yaml(self.cfg),
                keep_last=self.cfg.train.keep_last,
            )
        barrier(self.env)
        return path

    def _save_sharded(self) -> Path | None:
        """Every rank writes its shards into a staging directory; rank 0 completes it (state, whole weights,
        manifest) and renames it into place (tcsm.train.sharded)."""
        from tcsm.train import sharded

        if self.checkpoint_root is None:
            return None
        ema_model = self.ema.model if self.ema is not None else None
        log_window = self.log_window_state()  # a collective: every rank, before rank 0 alone writes the state
        staged = sharded.staging_dir(self.checkpoint_root, self.step, self.env)
        sharded.write_shards(staged, self.model, self.optimizer, ema_model, self.env)
        consolidated = self.cfg.train.consolidated_weights
        weights = sharded.full_weights(self.model, self.env) if consolidated else None
        ema_weights = sharded.full_weights(ema_model, self.env) if consolidated and ema_model is not None else None
        path = None
        if self.env.is_main:
            path = save_checkpoint(
                self.checkpoint_root,
                self.step,
                model=weights,
                ema_model=ema_weights,
                state=self.state(log_window),
                config_yaml=OmegaConf.to_yaml(self.cfg),
                keep_last=self.cfg.train.keep_last,
                staged=staged,
            )
        barrier(self.env)
        return path

    def _init_weights(self, where: str, ema: bool) -> None:
        """Load a trained model's weights (EMA ones if saved and requested) as the starting point."""
        directory = resolve_checkpoint(where)
        self._check_same_tokens(read_state(directory)[1].get("data_info") or {}, str(directory))
        use_ema = ema and (directory / "ema.safetensors").is_file()
        load_weights_into(
            self.model, read_weights(directory, ema=use_ema, device=self.device), str(directory)
        )

    def _check_same_tokens(self, saved_info: dict, where: str) -> None:
        """CheckpointError unless this run's data has the token ids of the checkpoint's (vocabulary, tokenizer)."""
        from tcsm.builders.components import DataInfo

        if saved_info.get("tokenizer_identity"):
            known = {k: v for k, v in saved_info.items() if k in DataInfo.__dataclass_fields__}
            DataInfo(**known).check_compatible(self.data, where)

    def _check_same_data(self, saved_info: dict, where: str) -> None:
        """A resume must read the token stream the checkpoint was trained on: the same tokenizer and, for
        prepared shards, the same index (its checksum)."""
        self._check_same_tokens(saved_info, where)
        before, now = saved_info.get("index_checksum"), self.data_info.index_checksum
        if before and now and before != now:
            raise CheckpointError(
                f"cannot resume {where!r}: its shards had index sha256 {before[:12]}…, data.path now holds "
                f"{now[:12]}…; resume with the shards it was trained on"
            )

    def _restore(self, resume) -> None:
        if resume is True:
            if self.checkpoint_root is None:
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
        rng = state.get("rng", {})
        if "torch" in rng:
            torch.set_rng_state(rng["torch"])
        if "cuda" in rng and self.device.type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"], self.device)
        self.step = step
        self.elapsed = float(state.get("elapsed_s", 0.0))
        self.last_eval = dict(state.get("last_eval") or {})
        window = state.get("log_window")
        if window is None:  # saved before the window was: the next row averages fewer steps, and says so
            self.window_lost = step % self.cfg.train.log_every != 0
        else:
            self.window = {
                k: v.to(self.device) if isinstance(v, torch.Tensor) else float(v) for k, v in window["sums"].items()
            }
            self.window_steps = int(window["steps"])
            self.window_elapsed_before = float(window["elapsed_s"])
        self.resumed_from = directory

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
