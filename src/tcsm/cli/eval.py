"""`tcsm eval`: bits per token and perplexity of a checkpoint on a data split, with the likelihood bound of
tcsm.evaluation.likelihood (MATH.md §2), or with the checkpoint objective's own metric where it has one (the exact or
pseudo-NLL of a clean-data model, tcsm.objectives.clean_lm), as in the trainer's validation."""

from __future__ import annotations

import argparse
import json
import textwrap

HELP = "evaluate a checkpoint: likelihood bound (or a clean model's NLL) as bits per token and perplexity"
EPILOG = textwrap.fill(
    "Cost: a pre-trained run's bound makes one denoiser call per sequence and time (--num-t). An energy model "
    "(tcsm finetune dre, strategy ii) has no tractable bound; its importance-sampling estimate makes n * (1 + "
    "masked positions) energy calls per sequence and time, n = the largest --log-z-samples (16): about 270 times "
    "as many at length 32. So by default it evaluates the run's train.eval_examples sequences (64 in the "
    "finetune-dre preset), prints the number of calls before it starts and its progress with an ETA; raise the "
    "cost with --max-examples (more sequences, a smaller stderr), --num-t or --log-z-samples (a less biased log Z)."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="run directory, its checkpoints/ directory, or one step_* checkpoint")
    p.add_argument(
        "overrides", nargs="*", metavar="key=value", help="config overrides (eval.*, data.*; not model.*)"
    )
    p.add_argument("--split", choices=("train", "valid", "test"), help="data split (default: eval.split)")
    p.add_argument("--num-t", type=int, help="time samples per sequence (default: eval.num_t)")
    p.add_argument("--batch-size", type=int, help="sequences per batch (default: eval.batch_size)")
    p.add_argument(
        "--max-examples",
        type=int,
        help="evaluate the first N sequences only (default: the whole split; an energy model's: train.eval_examples)",
    )
    p.add_argument(
        "--log-z-samples",
        metavar="N,N,...",
        help="energy models: reference draws n for log Z, one estimate per n; the cost grows with the largest "
        "(default: the run's objective.log_z_samples, 1,4,16)",
    )
    p.add_argument("--bound", help="likelihood bound (default: the path's, see tcsm.evaluation.likelihood)")
    p.add_argument("--weights", choices=("ema", "model"), help="EMA or raw weights (default: EMA when saved)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument(
        "--precision", choices=("fp32", "bf16"), default="fp32", help="matmul precision (default fp32)"
    )
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--output", help="also write the JSON result to this file")


def build_run_data(ckpt):
    """The checkpoint's data bundle; when its files are gone (moved, deleted), a DataError that names them and the
    override that points the run at their new place."""
    from omegaconf import OmegaConf

    from tcsm.data import refuse_missing_data

    refuse_missing_data(OmegaConf.to_container(ckpt.config.data, resolve=True), repr(str(ckpt.directory)),
                        "give its new location as an override: tcsm eval RUN data.{key}=NEW_PATH")
    return ckpt.build_data()


def run(args) -> int:
    import math
    import sys

    import torch

    from tcsm.builders.assemble import build_objective_for_checkpoint
    from tcsm.builders.components import DataInfo
    from tcsm.builders.loading import load_checkpoint
    from tcsm.cli.common import check_writable, format_bound, jsonable
    from tcsm.core.errors import ConfigError
    from tcsm.models.kinds import kind_of
    from tcsm.storage.fileio import write_atomically
    from tcsm.train.distributed import resolve_device
    from tcsm.train.trainer import autocast, evaluate_model

    if args.max_examples is not None and args.max_examples < 1:
        raise ConfigError(
            f"--max-examples must be >= 1 (leave it out to evaluate the whole split), got {args.max_examples}"
        )
    overrides = list(args.overrides)
    for key, value in (
        ("split", args.split),
        ("num_t", args.num_t),
        ("batch_size", args.batch_size),
        ("max_examples", args.max_examples),
        ("bound", args.bound),
    ):
        if value is not None:
            overrides.append(f"eval.{key}={value}")
    if args.weights is not None:
        overrides.append(f"eval.ema={args.weights == 'ema'}")
    if args.log_z_samples is not None:
        overrides.append(f"objective.log_z_samples=[{_positive_list(args.log_z_samples, '--log-z-samples')}]")
    if args.output:  # before any work
        check_writable(args.output)
    device = resolve_device(args.device)
    ckpt = load_checkpoint(args.checkpoint, device=device, overrides=overrides, ema=True)
    e = ckpt.config.eval
    if not e.ema and ckpt.weights == "ema":
        ckpt = load_checkpoint(args.checkpoint, device=device, overrides=overrides, ema=False)
    data = build_run_data(ckpt)
    DataInfo(**ckpt.data_info).check_compatible(data, str(ckpt.directory))
    max_len = getattr(getattr(ckpt.model, "cfg", None), "max_len", None)
    if max_len is not None and data.seq_len > max_len:
        raise ConfigError(f"data sequences have length {data.seq_len} but the model allows at most {max_len}")
    x = data.split(e.split)
    objective = build_objective_for_checkpoint(ckpt.config, ckpt.model, data, device)
    energy = kind_of(ckpt.model).likelihood == "estimate"  # an energy model's IS estimate (MATH.md §6.3)
    # An energy run's estimate costs ~n(1 + L/2) energy calls per sequence and time: by default, as many sequences as
    # its training evaluated (a run that evaluated none: the finetune-dre preset's 64), not the whole split.
    limit = e.max_examples or ((int(ckpt.config.train.eval_examples) or 64) if energy else None)
    if limit:
        x = x[:limit]
    if x.shape[0] == 0:
        raise ConfigError(f"the {e.split} split is empty")
    if energy and not args.json:
        print(_energy_cost_line(objective, x, data.split(e.split).shape[0], e), file=sys.stderr, flush=True)
    generator = torch.Generator(device=device).manual_seed(e.seed)
    with autocast(device, args.precision):
        result = evaluate_model(
            objective,
            ckpt.model,
            x,
            ckpt.build_path(),
            e,
            generator=generator,
            device=device,
            progress=energy or (sys.stderr.isatty() and not args.json),
        )
    floor = data.nats_per_token_floor
    if floor is not None:
        result["floor_bpc"] = floor / math.log(2)
    result.update(
        checkpoint=str(ckpt.directory),
        step=ckpt.step,
        weights=ckpt.weights,
        split=e.split,
        data=data.label,
        precision=args.precision,
    )
    strict = jsonable(result)  # JSON has no inf; the printed line keeps a diverged model's "inf" perplexity
    if args.output:
        write_atomically(args.output, json.dumps(strict, indent=1))
    if args.json:
        print(json.dumps(strict))
    else:
        print(f"{ckpt.directory} (step {ckpt.step}, {ckpt.weights} weights) on {data.label} {e.split}:")
        print(f"  {format_bound(result)}")
    return 0


def _positive_list(text: str, flag: str) -> str:
    from tcsm.core.errors import ConfigError

    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise ConfigError(f"{flag} must be comma-separated positive integers, e.g. 1,4,16; got {text!r}")
    return ",".join(map(str, values))


def _energy_cost_line(objective, x, split_size: int, e) -> str:
    """What the energy model's estimate will cost, before it starts, and how to change it."""
    from tcsm.posttrain.dre.likelihood import energy_estimate_cost

    N, L = x.shape
    ns = objective.log_z_samples
    rows = energy_estimate_cost(objective.path, N, L, objective.eval_num_t, max(ns))
    which = f"the first {N} of {split_size}" if N < split_size else f"all {N}"
    return (
        f"energy-model estimate on {which} {e.split} sequences x {objective.eval_num_t} times x n={max(ns)} reference "
        f"draws: about {rows:,.0f} energy calls (a pre-trained bound: {N * e.num_t:,}); more with --max-examples, "
        "--num-t, --log-z-samples"
    )
