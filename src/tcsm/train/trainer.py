"""One training loop for every objective: the trainer calls `objective(model, batch, generator)`
and nothing else method-specific (DESIGN.md; the contract is `tcsm.core.protocols`). It adds AdamW with warm-up and decay, gradient clipping and accumulation, EMA,
bf16 autocast, DDP, periodic validation with the likelihood bound, logged samples, and exact resume.

Randomness is a function of (seed, step, micro-batch index) only. Each global batch (fixed by the seeded data
order) is cut into micro-batches of `train.micro_batch` sequences; micro-batch c of step s draws its times and
noise from a generator seeded with (seed, s, c), and rank r of W processes micro-batches r, r+W, r+2W, ….
So one process and W processes compute the same per-example losses and — after DDP's gradient average —
the same update (to float summation order), and a resumed run replays exactly the steps it missed.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from tcsm.builders.assemble import build_components
from tcsm.builders.components import Components, DataInfo
from tcsm.builders.config import set_values
from tcsm.core.errors import ConfigError, TrainingError
from tcsm.core.precision import autocast, resolve_precision
from tcsm.core.progress import WorkProgress
from tcsm.core.protocols import KeepsState, StepInfo, TrainerCallback
from tcsm.core.results import EvalResult
from tcsm.data import absolute_paths
from tcsm.data.base import readable_text
from tcsm.evaluation.run import evaluate_model
from tcsm.storage.checkpoint import (
    clean_leftovers,
)
from tcsm.storage.fileio import atomic_path, write_atomically
from tcsm.train.checkpointer import Checkpointer, LoopCounters, warm_start
from tcsm.train.distributed import DistEnv, all_reduce_mean, barrier, setup_distributed
from tcsm.train.ema import EMA
from tcsm.train.logs import LOGGERS, RunLogger, plot_curves
from tcsm.train.optim import build_optimizer, lr_at, set_lr
from tcsm.train.parallel import Parallel
from tcsm.train.preempt import Preempted, catch_sigterm, sigterm_received
from tcsm.train.rundir import clear_run, hold_run_dir, refuse_existing_run, refuse_overwriting_sources

__all__ = ["Trainer", "stream_seed"]


def stream_seed(*keys: int) -> int:
    """A 63-bit seed from integer keys (e.g. seed, step, micro-batch): independent streams per key tuple."""
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(1, np.uint64)[0] >> np.uint64(1))


def micro_batch_plan(t, world_size: int) -> tuple[int, int]:
    """(sequences per micro-batch, micro-batches per step): the unit of randomness, identical for every world
    size when train.micro_batch is set; ConfigError if the processes cannot share it."""
    W = world_size
    micro = int(t.micro_batch) if t.micro_batch else t.batch_size // W
    if t.micro_batch is None and t.batch_size % W:
        raise ConfigError(f"train.batch_size={t.batch_size} must be a multiple of the {W} processes")
    num_micro = t.batch_size // micro
    if num_micro % W:
        raise ConfigError(
            f"train.batch_size / train.micro_batch = {num_micro} micro-batches cannot be shared by {W} "
            "processes; choose a micro_batch that makes it a multiple of the process count"
        )
    return micro, num_micro


#: config keys other than the data's that name a local file or directory a run reads again when it is loaded
RUN_PATH_KEYS = ("model.name_or_path", "reference.path", "train.init_from")


def _with_absolute_paths(cfg):
    """The config with relative file locations made absolute — the data's (tcsm.data.absolute_paths), the Hugging
    Face model directory, the frozen reference and the run it starts from (when they name a local path; a Hub name
    stays) — so that the run's saved config finds them from any directory and after the run directory moves."""
    from omegaconf import OmegaConf

    changed = {f"data.{k}": v for k, v in absolute_paths(OmegaConf.to_container(cfg.data, resolve=True)).items()}
    for key in RUN_PATH_KEYS:
        value = OmegaConf.select(cfg, key, default=None)
        if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
            local = Path(value).expanduser()
            if local.exists():
                changed[key] = str(local.resolve())
    return set_values(cfg, changed) if changed else cfg


def _refuse_moved_data(cfg, run_dir) -> None:
    """A resumed run whose data files are gone (moved, deleted) is told the override that points it at their new
    place, as `tcsm eval` is, instead of only that a file is not found."""
    from tcsm.data import refuse_missing_data

    refuse_missing_data(OmegaConf.to_container(cfg.data, resolve=True), f"run {str(run_dir)!r}",
                        "resume with its new location as an override: --resume data.{key}=NEW_PATH")


class Trainer:
    """Train `components` (data, path, model, target, objective) under the `optim` / `train` / `eval` / `sample`
    settings of `cfg` in `run_dir`; `resume` is a checkpoint path or True (the run's latest).

    >>> Trainer.from_config(load_config("synthetic"), "runs/demo").fit()     # built from a run config
    >>> Trainer(components, cfg, None).fit()                                 # objects built by hand

    `cfg` is still the whole run config: it is what checkpoints store so that a run can be resumed and its model
    rebuilt. `callbacks` (`tcsm.core.protocols.TrainerCallback`) are added to `components.callbacks`.
    `self.checkpoints` (tcsm.train.checkpointer.Checkpointer) writes and reads the run's checkpoints; the loop
    calls `save()` every `train.save_every` steps.
    """

    def __init__(
        self,
        components: Components,
        cfg,
        run_dir: str | Path | None,
        *,
        resume: str | Path | bool | None = None,
        env: DistEnv | None = None,
        log: Callable[[str], None] | None = None,
        callbacks=(),
        overwrite: bool = False,
    ):
        self.env = env if env is not None else setup_distributed(cfg.train.device)
        # One writer per run directory, from before anything is written until `fit` returns (tcsm.train.rundir).
        self._lock = hold_run_dir(run_dir, self.env.is_main)
        try:
            self._init(components, cfg, run_dir, resume, log, callbacks, overwrite)
        except BaseException:
            self._lock.release()
            raise
        weakref.finalize(self, self._lock.release)  # a trainer dropped without `fit` frees its directory

    def _init(self, components, cfg, run_dir, resume, log, callbacks, overwrite):
        if not resume and self.env.is_main:  # before anything is written: never touch another run's directory
            if overwrite and run_dir is not None:
                refuse_overwriting_sources(run_dir, cfg)  # the run it starts from must survive the overwrite
            else:
                refuse_existing_run(run_dir)
        self.cfg = _with_absolute_paths(cfg)
        self.device = self.env.device
        # (first step with a non-finite gradient, its loss); -1 while there is none (see _note_finite)
        self._defer_finite_check = self.device.type != "cpu"
        self._nonfinite = torch.tensor([-1.0, math.nan], device=self.device)
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self._print = log if log is not None else (lambda s: print(s, flush=True))
        t = cfg.train
        if t.threads:
            torch.set_num_threads(int(t.threads))
        self.micro, self.num_micro = micro_batch_plan(t, self.env.world_size)

        self.parts = components
        self.data, self.path, self.objective = components.data, components.path, components.objective
        self.model = components.model
        self.callbacks = [*components.callbacks, *callbacks]
        for cb in self.callbacks:
            if not isinstance(cb, TrainerCallback):
                raise TypeError(f"{cb!r} is not a TrainerCallback (on_fit_start, on_step_end)")
        if t.init_from and not resume:
            warm_start(self.model, t.init_from, ema=t.init_weights == "ema", data=self.data, device=self.device,
                       seed=t.seed)
        self.precision = resolve_precision(t.precision, self.device, self.model)
        self.parallel = Parallel.of(t, self.env, self.precision)
        if t.logger not in LOGGERS:  # before anything is written (an --overwrite clears the old run below)
            raise ConfigError(f"train.logger must be one of {list(LOGGERS)}, got {t.logger!r}")
        self.data_info = DataInfo.of(self.data)
        self.ema = EMA(self.model, t.ema) if t.ema > 0 else None
        # Wrapped (DDP) or sharded (FSDP) before the optimizer is built: FSDP replaces the parameters.
        self.forward_model = self.parallel.prepare(self.model, self.ema.model if self.ema is not None else None)
        self.optimizer = build_optimizer(self.model, cfg.optim)
        if t.compile:
            self.forward_model = torch.compile(self.forward_model)

        from tcsm.data import EpochBatches

        # Global indices on every rank: each rank then takes its micro-batches from the same global batch.
        # An import (train.steps=0) draws no batch: its data may be a tokenizer with no rows (data.kind=tokenizer).
        rows = (self.data.split("train") if t.steps > 0 else self.data.train).shape[0]  # split(): a no-text refusal
        self.batches = EpochBatches(rows, t.batch_size, seed=t.seed, draws=t.steps > 0)
        self.step = 0
        self.elapsed = 0.0  # training wall time over all sessions of this run
        self.last_eval: dict[str, Any] = {}
        # The open logging window (metric sums since the last train row), saved with a checkpoint so that a row
        # replayed after a resume averages the same steps as the uninterrupted run's.
        self.window: dict[str, Any] = {}
        self.window_steps, self.window_start = 0, time.perf_counter()
        self.window_elapsed_before = 0.0  # of the window restored from a checkpoint: its time before the save
        self.window_lost = False  # restored from a checkpoint that predates saving the window
        self.checkpoints = Checkpointer(
            self.run_dir, self.cfg, env=self.env, parallel=self.parallel, model=self.model, ema=self.ema,
            optimizer=self.optimizer, batches=self.batches, data=self.data, data_info=self.data_info,
            parts={name: part for name, part in (("target", components.target), ("objective", self.objective))
                   if isinstance(part, KeepsState)},
        )
        if resume:
            self.resumed_from, counters = self.checkpoints.restore(resume)
            self._continue_from(counters)
        if overwrite and not resume and run_dir is not None and self.env.is_main:
            # Everything that can fail while building (components, warm start, optimizer) has succeeded: only now
            # is the old run replaced, so a run that cannot start never costs the old one its files.
            clear_run(run_dir)
        # Rows logged after the checkpoint a resume starts from belong to steps that are about to be replayed.
        self.logger = RunLogger(
            self.run_dir,
            enabled=self.env.is_main,
            tensorboard=t.tensorboard,
            resume_step=self.step if resume else None,
            backend=t.logger,
            config=OmegaConf.to_container(self.cfg, resolve=True),
        )

    @classmethod
    def from_config(
        cls, cfg, run_dir: str | Path | None, *, resume=None, env: DistEnv | None = None, overwrite: bool = False,
        **kwargs,
    ) -> Trainer:
        """Build the run's components from `cfg` (seeded: initial weights depend on train.seed only; DDP also
        broadcasts rank 0's weights) and wrap them in a Trainer; `kwargs` (log, callbacks) go to its constructor."""
        env = env if env is not None else setup_distributed(cfg.train.device)
        with hold_run_dir(run_dir, env.is_main):  # held while the components are built; the Trainer takes its own hold
            if not resume and not overwrite and env.is_main:  # before data and models are built (rank 0 writes)
                refuse_existing_run(run_dir)
            if not resume and overwrite and env.is_main and run_dir is not None:
                refuse_overwriting_sources(run_dir, cfg)
            if cfg.train.threads:
                torch.set_num_threads(int(cfg.train.threads))
            micro_batch_plan(cfg.train, env.world_size)  # a bad plan fails before data and models are built
            if resume:
                _refuse_moved_data(cfg, run_dir)
            torch.manual_seed(cfg.train.seed)
            components = build_components(cfg, env.device)
            return cls(components, cfg, run_dir, resume=resume, env=env, overwrite=overwrite, **kwargs)

    # ----------------------------------------------------------------------------------------------- state

    def counters(self, log_window: dict | None = None) -> LoopCounters:
        """The loop's counters as a checkpoint stores them (`log_window`: see `log_window_state`)."""
        window = log_window if log_window is not None else self.log_window_state()
        return LoopCounters(self.step, self.elapsed, self.last_eval, window)

    def log_window_state(self) -> dict:
        """The open logging window: metric sums since the last train row, their step count and wall time. Several
        processes: the mean of their sums (a collective: call on every rank), so a replayed row equals the
        uninterrupted one up to rounding; one process: the sums themselves, so it is identical."""
        sums = {k: v.detach().cpu() if isinstance(v, torch.Tensor) else float(v) for k, v in self.window.items()}
        if self.env.distributed:
            sums = all_reduce_mean({k: float(v) for k, v in sums.items()}, self.env)
        return {"steps": self.window_steps, "sums": sums, "elapsed_s": time.perf_counter() - self.window_start}

    def _continue_from(self, counters: LoopCounters) -> None:
        """Take the loop's counters of a restored checkpoint, its logging window included."""
        self.step, self.elapsed, self.last_eval = counters.step, counters.elapsed, counters.last_eval
        window = counters.log_window
        if window is None:  # saved before the window was: the next row averages fewer steps, and says so
            self.window_lost = self.step % self.cfg.train.log_every != 0
        else:
            self.window = {
                k: v.to(self.device) if isinstance(v, torch.Tensor) else float(v) for k, v in window["sums"].items()
            }
            self.window_steps = int(window["steps"])
            self.window_elapsed_before = float(window["elapsed_s"])

    def save(self) -> Path | None:
        """Write a checkpoint of the current step (rank 0; shards on every rank under FSDP) and wait for it on
        every rank; never one whose weights a non-finite update has corrupted."""
        self.check_finite()
        return self.checkpoints.save(self.counters())

    def eval_model(self) -> torch.nn.Module:
        """The model evaluation and sampling use: the EMA copy when there is one and eval.ema is set."""
        return self.ema.model if (self.ema is not None and self.cfg.eval.ema) else self.model

    # ----------------------------------------------------------------------------------------------- steps

    def train_step(self) -> dict[str, float]:
        """One optimizer update over the global batch; returns this rank's step metrics (objective metrics as
        0-d tensors on the device, summed without a host sync; lr and grad_norm as floats)."""
        t, env = self.cfg.train, self.env
        lr = lr_at(self.step, t.steps, self.cfg.optim)
        set_lr(self.optimizer, lr)
        self.model.train()
        indices = next(self.batches)
        mine = list(range(env.rank, self.num_micro, env.world_size))
        # Each micro-batch loss is a mean over its sequences; the update follows the mean over micro-batches.
        # DDP averages over ranks, so each rank scales its share by W / num_micro.
        scale = env.world_size / self.num_micro
        sums: dict[str, Any] = {}
        for k, c in enumerate(mine):
            seed = stream_seed(t.seed, self.step, c)
            generator = torch.Generator(device=self.device).manual_seed(seed)
            torch.manual_seed(seed)  # model-internal randomness (dropout) follows the same stream
            batch = self.data.get_batch("train", indices[c * self.micro : (c + 1) * self.micro], self.device)
            with self.parallel.accumulate(self.forward_model, last=k == len(mine) - 1):
                with autocast(self.device, self.precision):
                    # The run's frozen reference reached what needs it when the run was built
                    # (tcsm.core.protocols.TrainingObjective): the step passes only the model, batch and noise.
                    loss, metrics = self.objective(self.forward_model, batch, generator=generator)
                (loss * scale).backward()
            if "loss" not in metrics:  # the protocol asks only for (loss, metrics); the log always has the loss
                metrics = {**metrics, "loss": loss.detach()}
            for key, v in metrics.items():  # summed where they live: no host sync per micro-batch
                sums[key] = sums.get(key, 0.0) + v / len(mine)
        clip = float(self.cfg.optim.clip) if self.cfg.optim.clip > 0 else math.inf
        grad_norm = self.parallel.grad_norm(torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)).detach()
        self._note_finite(grad_norm, sums.get("loss"))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update(self.model)
        self.step += 1
        sums.update(lr=lr, grad_norm=grad_norm)
        for cb in self.callbacks:
            cb.on_step_end(self._info())
        return sums

    def _note_finite(self, grad_norm: torch.Tensor, loss) -> None:
        """Refuse a non-finite gradient. On a CPU the check reads the norm at once (the read costs nothing); on an
        accelerator reading it would stall every step, so the first bad step is recorded on the device and
        `check_finite` raises at the next host sync — a logging window, an evaluation, a save — before anything
        computed from the corrupted weights is written or reported."""
        step = self.step + 1
        if not self._defer_finite_check:
            if not math.isfinite(float(grad_norm)):  # identical on every rank: the gradients are already averaged
                self._raise_nonfinite(step, math.nan if loss is None else float(loss))
            return
        # Fill kernels take the scalars as arguments: no host-to-device copy, so no stall either.
        loss = grad_norm.new_full((), math.nan) if loss is None else torch.as_tensor(loss).to(grad_norm)
        seen = torch.stack([grad_norm.new_full((), step), loss])
        first = ~torch.isfinite(grad_norm) & (self._nonfinite[0] < 0)
        self._nonfinite = torch.where(first, seen, self._nonfinite)

    def check_finite(self) -> None:
        """Raise if a step since the last check had a non-finite gradient (one host sync; see `_note_finite`)."""
        if self._defer_finite_check:
            step, loss = self._nonfinite.tolist()  # one read for both values
            if step >= 0:
                self._raise_nonfinite(int(step), loss)

    @staticmethod
    def _raise_nonfinite(step: int, loss: float) -> None:
        raise TrainingError(
            f"non-finite gradient at step {step} (loss {loss:.4g}); lower optim.lr, raise optim.warmup or use "
            "train.precision=fp32"
        )

    def _info(self) -> StepInfo:
        return StepInfo(self.step, self.model, self.ema.model if self.ema is not None else None, self.run_dir)

    # ----------------------------------------------------------------------------------------------- eval

    @torch.no_grad()
    def validate(self, max_examples: int | None = None, precision: str | None = None) -> EvalResult | dict:
        """The objective's validation metric (by default the likelihood bound) of the eval model on the eval split
        (rank 0; MATH.md §2.4)."""
        self.check_finite()
        e = self.cfg.eval
        data = self.data.split(e.split)
        if max_examples:
            data = data[:max_examples]
        if data.shape[0] == 0:
            return {}
        generator = torch.Generator(device=self.device).manual_seed(e.seed)
        with autocast(self.device, precision or self.precision):
            result = evaluate_model(
                self.objective, self.eval_model(), data, self.path, e, generator=generator, device=self.device
            )
        if self.data_info.nats_per_token_floor is not None:
            result["floor_bpc"] = self.data_info.nats_per_token_floor / math.log(2)
        return result

    _said_no_sampler = False

    @torch.no_grad()
    def samples(self) -> list[str]:
        """`sample.num` decoded sequences from the eval model (rank 0), drawn by the run's sampler
        (`tcsm.sampling.settings`: the objective's own when it declares one, the path sampler otherwise, with the
        `sample:` settings); none when the model has no sampler. Data whose rows carry prompts (tasks, SFT records)
        gets completions of held-out prompts, never of training ones."""
        from tcsm.data.prompted import held_out_prompts
        from tcsm.sampling.settings import build_sampler

        s = self.cfg.sample
        if s.num == 0:
            return []
        generator = torch.Generator(device=self.device).manual_seed(s.seed)
        length = s.length or self.data_info.seq_len
        sampler = build_sampler(self.cfg, self.eval_model(), self.path, self.objective)
        fixed, values = held_out_prompts(self.data, s.num, length) or (None, None)
        with autocast(self.device, self.precision):
            tokens, _ = sampler(s.num, length, generator=generator, device=self.device, fixed=fixed, values=values)
        if tokens is None:
            if not self._said_no_sampler:
                self._said_no_sampler = True
                self._write(
                    f"sampling skipped: objective {self.cfg.objective.name!r} trains a model that has no sampler "
                    "(set sample.num=0 to silence this line)"
                )
            return []
        tok = getattr(self.data, "tokenizer", None)
        return [readable_text(tok, row) if tok is not None else self.data.decode(row) for row in tokens.cpu()]

    def _periodic(self, every: int, final: bool) -> bool:
        return final or (every > 0 and self.step % every == 0)

    def _reports(self) -> bool:
        """This rank evaluates and samples: rank 0, or every rank when a forward pass needs them all (FSDP)."""
        return self.env.is_main or self.parallel.collective_forward

    def _eval_and_log(self, final: bool) -> None:
        if not self._reports():
            return
        result = self.validate(max_examples=self.cfg.train.eval_examples)
        if result:
            self.last_eval = {k: v for k, v in result.items() if isinstance(v, (int, float, str))}
            self.logger.scalars("valid", self.step, self.last_eval)
            floor = f" (source entropy {result['floor_bpc']:.4f})" if "floor_bpc" in result else ""
            self._write(
                f"step {self.step}: {result.label} on {self.cfg.eval.split} {result.bpc:.4f} ± "
                f"{result.bpc_stderr:.4f} bits/token{floor}, ppl {result.perplexity:.3f} [{result.num_sequences} seqs]"
            )

    def _sample_and_log(self) -> None:
        if not self._reports():
            return
        self.check_finite()
        texts = self.samples()
        if texts and self.env.is_main:
            self.logger.samples(self.step, texts)
            self._write(f"step {self.step}: samples\n" + "\n".join(f"  | {t}" for t in texts))

    def _warn_empty_held_out(self) -> None:
        """An evaluation split without a single row is said once at the start: without it the run would train with
        no validation at all, silently (e.g. a prepared corpus whose few documents all hashed into train). An empty
        test split is not: some kinds have none by default (preference pairs), and training never reads it."""
        split = self.cfg.eval.split
        if getattr(self.data, split, None) is None or len(self.data.split(split)) > 0:
            return
        name = {"valid": "validation", "test": "test", "train": "training"}[split]
        self._print(
            f"warning: the data has no {name} rows of {self.data_info.seq_len} tokens (eval.split={split}): this run "
            "trains without validation (no held-out metric); give it more documents or a larger held-out fraction "
            "(tcsm prepare --val-fraction, data.valid_frac)"
        )

    def _write(self, msg: str) -> None:
        if not self.env.is_main:  # ranks that evaluate alongside rank 0 (FSDP) have nothing of their own to say
            return
        if self._bar is not None and self._bar.bar_shown:  # printed above a live progress bar
            self._bar.write(msg)
        else:
            self._print(msg)

    # ----------------------------------------------------------------------------------------------- loop

    _bar = None
    #: seconds between progress lines when output is not a terminal (the last step always gets one)
    progress_every_s = 60.0

    def fit(self) -> dict:
        """Train until train.steps, with periodic validation, samples and checkpoints; returns a summary. The run
        directory's lock is released when it returns or fails (an earlier `fit` of this trainer may have freed it:
        it is taken again)."""
        try:
            with catch_sigterm(), hold_run_dir(self.run_dir, self.env.is_main):
                return self._fit()
        finally:
            self._lock.release()

    def _fit(self) -> dict:
        t, env = self.cfg.train, self.env
        idle = self.step >= t.steps and not (t.steps == 0 and self.step == 0)  # a resume with nothing to do
        if self.env.is_main and self.run_dir is not None and not idle:  # an idle resume leaves the run as it was
            (self.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(self.cfg), encoding="utf-8")
            self._save_tokenizer()
            clean_leftovers(self.checkpoints.root)
        if t.steps == 0 and self.step == 0 and self.checkpoints.root is not None and not self.checkpoints.root.is_dir():
            self.save()  # an import: the model as built (and started) becomes the run's step-0 checkpoint
            self._print(f"train.steps=0: the model as built is the run's checkpoint in {self.checkpoints.root}")
            return self.summary()
        if self.step >= t.steps:
            self._print(f"nothing to do: the run is at step {self.step} >= train.steps={t.steps}")
            return self.summary()
        if env.is_main:
            from tcsm.models import count_parameters

            self.logger.open()  # closed when an earlier fit of this trainer returned

            trained, total = count_parameters(self.model), count_parameters(self.model, trainable_only=False)
            size = f"{trained / 1e6:.2f}M parameters" + (f" trained of {total / 1e6:.2f}M" if trained < total else "")
            self._print(
                f"{self.data.summary()}\nmodel: {size}, "
                f"{self.path.kind} path, {self.precision}, device {self.device}, {env.world_size} process(es), "
                f"{self.num_micro} micro-batch(es) of {self.micro}; "
                + (f"resuming at step {self.step}" if self.step else f"{t.steps} steps")
            )
            self._warn_empty_held_out()
        # A bar on a terminal; otherwise a line every progress_every_s with the step, rate and ETA (a log file, a
        # batch job). (The training loss is in metrics.jsonl; in a line it would be the one figure in nats.)
        self._bar = WorkProgress(t.steps, "step", "steps", initial=self.step, every_s=self.progress_every_s,
                                 enabled=env.is_main and t.progress, emit=self._print)  # fmt: skip
        self.window_start = time.perf_counter() - self.window_elapsed_before
        self.window_elapsed_before = 0.0
        for cb in self.callbacks:
            cb.on_fit_start(self._info())
        tokens_per_step = t.batch_size * self.data_info.seq_len
        try:
            while self.step < t.steps:
                metrics = self.train_step()
                window = self.window
                for k, v in metrics.items():
                    window[k] = window.get(k, 0.0) + v
                self.window_steps += 1
                window_steps, window_start = self.window_steps, self.window_start
                final = self.step == t.steps
                if self.step % t.log_every == 0 or final or self.step == 1:
                    now = time.perf_counter()
                    # The one host sync of a logging window: device metrics become floats here.
                    self.check_finite()
                    row = all_reduce_mean({k: float(v) / window_steps for k, v in window.items()}, env)
                    row["lr"], row["grad_norm"] = metrics["lr"], float(metrics["grad_norm"])
                    row["tokens_per_s"] = tokens_per_step * window_steps / max(now - window_start, 1e-9)
                    self.elapsed += now - window_start
                    row["elapsed_s"] = self.elapsed
                    if self.window_lost:  # an older checkpoint: this row averages only the steps since the resume
                        row["window_steps_since_resume"] = window_steps
                        self.window_lost = False
                    self.logger.scalars("train", self.step, row)
                    self._bar.postfix(loss=f"{row['loss']:.4f}", lr=f"{row['lr']:.2e}")
                    describe = getattr(self.objective, "log_line", None)  # an objective's own figures to watch
                    if describe is not None and env.is_main:
                        self._bar.write(f"step {self.step}: loss {row['loss']:.4f}, {describe(row)}")
                    self.window, self.window_steps, self.window_start = {}, 0, time.perf_counter()
                self._bar.update(1, final=final)
                did_eval = self._periodic(t.eval_every, final)
                if did_eval:
                    self._eval_and_log(final)
                if self._periodic(t.sample_every, final):
                    self._sample_and_log()
                saved = self._periodic(t.save_every, final)
                if saved:
                    self.save()
                if did_eval:
                    barrier(env)
                    self.window_start = time.perf_counter()  # evaluation time is not training throughput
                if not final and self._stop_requested():
                    self._stop(saved)
        finally:
            self._bar.close()
            self._bar = None
        summary = self.summary()
        if env.is_main:
            plot_curves(self.run_dir, summary.get("floor_bpc")) if self.run_dir is not None else None
            self.logger.close()
        return summary

    def _stop_requested(self) -> bool:
        """Whether a SIGTERM reached this process (any rank, under torchrun: all ranks stop at the same step)."""
        stop = sigterm_received()
        if self.env.distributed:
            import torch.distributed as dist

            flag = torch.tensor([float(stop)], device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            stop = bool(flag.item())
        return stop

    def _stop(self, saved: bool) -> None:
        """Preempted: keep the finished step as a checkpoint (unless it was just saved) and leave as Ctrl-C does."""
        if not saved and self.checkpoints.root is not None:
            self.save()
        if self.env.is_main:
            self.logger.close()
        raise Preempted(self.step if self.checkpoints.root is not None else None)

    def _save_tokenizer(self) -> None:
        """tokenizer.json in the run directory for tokenizers that cannot be rebuilt from the checkpoint alone
        (BPE; a character vocabulary travels in every checkpoint's data_info), so sampling needs no data files;
        beside it tokenizer_config.json naming the data's real end-of-text and padding tokens (what `tcsm export`
        and `tcsm prepare --tokenizer RUN` read), and the data's chat template (an instruction run) as
        chat_template.jinja."""
        import json

        template = (getattr(self.data, "meta", None) or {}).get("chat_template")
        if isinstance(template, str):
            write_atomically(self.run_dir / "chat_template.jinja", template)
        tokenizer = getattr(self.data, "tokenizer", None)
        if getattr(self.data_info, "chars", None) or not hasattr(tokenizer, "save"):
            return
        with atomic_path(self.run_dir / "tokenizer.json") as tmp:
            tokenizer.save(tmp)
        hf = getattr(tokenizer, "hf", None)
        names = {}
        for key, value in (("eos_token", getattr(tokenizer, "eos_id", None)), ("pad_token", getattr(tokenizer, "pad_id", None))):
            token = hf.id_to_token(int(value)) if hf is not None and value is not None else None
            if token is not None:
                names[key] = token
        write_atomically(self.run_dir / "tokenizer_config.json", json.dumps(names, indent=1) + "\n")

    def summary(self) -> dict:
        out = {"step": self.step, "elapsed_s": round(self.elapsed, 2), "data": self.data_info.label}
        out.update(self.last_eval)
        return out

