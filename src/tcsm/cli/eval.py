"""`tcsm eval`: bits per token and perplexity of a checkpoint on a data split, with the likelihood bound of
tcsm.evaluation.likelihood (MATH.md §2), or with the checkpoint objective's own metric where it has one (the exact or
pseudo-NLL of an LM, tcsm.objectives.lm), as in the trainer's validation; and two more modes:

* `--zeroshot SETS`: zero-shot perplexity bounds of a GPT-2-BPE model on WikiText-2, PTB, LAMBADA and the
  LM1B subset, with the SEDD/MDLM protocol (docs/evaluation.md, tcsm.evaluation.zeroshot);
* `--genppl --scorer PATH`: generative perplexity of samples under a scorer causal LM and their
  unigram entropy, for one or several numbers of sampling steps (a plot with `--plot`), or for samples
  written by `tcsm sample --format jsonl` (`--samples`);
* `--task NAME`: accuracy on a verifiable task's held-out problems (sudoku, countdown, addition; docs/tasks.md)
  with a Wilson confidence interval, the model completing pinned prompts with the run's sampler (`sample:`
  section, or --method / --steps / --temperature / --top-p), for one or several step counts
  (tcsm.evaluation.tasks).

The shared options (--num-t, --batch-size, --bound, --weights, --device, --precision, --json, --output) keep their
meaning in every mode."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time

from tcsm.cli.common import emit_report

HELP = (
    "evaluate a checkpoint: likelihood bound (or an LM's NLL) as bits per token and perplexity; zero-shot "
    "(--zeroshot) and generative (--genppl) perplexity"
)
EPILOG = textwrap.fill(
    "Cost: a pre-trained run's bound makes one denoiser call per sequence and time (--num-t). An energy model "
    "(tcsm finetune dre, strategy ii) has no tractable bound; its importance-sampling estimate makes n * (1 + "
    "masked positions) energy calls per sequence and time, n = the largest --log-z-samples (16): about 270 times "
    "as many at length 32. So by default it evaluates the run's train.eval_examples sequences (64 in the "
    "finetune-dre preset), prints the number of calls before it starts and its progress with an ETA; raise the "
    "cost with --max-examples (more sequences, a smaller stderr), --num-t or --log-z-samples (a less biased log Z)."
)


def _add_bound_arguments(p: argparse.ArgumentParser) -> None:
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
        help="evaluate the first N sequences only (default: the whole split; an energy model's: train.eval_examples; "
        "--task: the first N held-out problems, default 500)",
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
    p.add_argument("--output", help="also write the JSON result to this file (a file tcsm did not write is kept "
                   "unless --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output file whatever wrote it")


def build_run_data(ckpt):
    """The checkpoint's data bundle; when its files are gone (moved, deleted), a DataError that names them and the
    override that points the run at their new place."""
    from omegaconf import OmegaConf

    from tcsm.data import refuse_missing_data

    refuse_missing_data(OmegaConf.to_container(ckpt.config.data, resolve=True), repr(str(ckpt.directory)),
                        "give its new location as an override: tcsm eval RUN data.{key}=NEW_PATH")
    return ckpt.build_data()


def _run_bound(args) -> int:
    import math
    import sys

    import torch

    from tcsm.builders.assemble import build_objective_for_checkpoint
    from tcsm.builders.components import DataInfo
    from tcsm.builders.loading import load_checkpoint
    from tcsm.cli.common import format_bound, jsonable
    from tcsm.core.errors import ConfigError
    from tcsm.core.precision import autocast
    from tcsm.evaluation.run import evaluate_model
    from tcsm.models.kinds import kind_of
    from tcsm.storage.fileio import write_atomically
    from tcsm.train.distributed import resolve_device

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
    energy = kind_of(ckpt.model).estimated_likelihood  # an energy model's IS estimate (MATH.md §6.3)
    # An energy run's estimate costs ~n(1 + L/2) energy calls per sequence and time: by default, as many sequences as
    # its training evaluated (a run that evaluated none: the finetune-dre preset's 64), not the whole split.
    limit = e.max_examples or ((int(ckpt.config.train.eval_examples) or 64) if energy else None)
    if limit:
        x = x[:limit]
    if x.shape[0] == 0:
        raise ConfigError(f"the {e.split} split is empty")
    cost = getattr(objective, "evaluation_cost", None)  # an `Evaluates` that is costly says what it will cost
    if cost is not None and not args.json:
        print(_cost_line(cost, x, data.split(e.split).shape[0], e), file=sys.stderr, flush=True)
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


def _cost_line(cost, x, split_size: int, e) -> str:
    """What the objective's own evaluation will cost, before it starts, and how to change it."""
    N, L = x.shape
    which = f"the first {N} of {split_size}" if N < split_size else f"all {N}"
    return f"{cost(N, L, f'{which} {e.split} sequences')} (a pre-trained bound: {N * e.num_t:,}); more with --max-examples, --num-t, --log-z-samples"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _add_bound_arguments(p)
    z = p.add_argument_group("zero-shot perplexity (GPT-2-BPE models; docs/evaluation.md)")
    z.add_argument("--zeroshot", metavar="SETS",
         help="comma-separated sets: wikitext2, ptb, lambada, lm1b, or all")
    z.add_argument("--data-root", metavar="DIR", help="folder holding the sets (default $TCSM_DATA_DIR or ../shared/data)")
    z.add_argument("--layout", choices=("sedd", "mdlm"), default="sedd",
         help="block layout: sedd = plain L-token blocks (default); mdlm = BOS + L-2 tokens + EOS")
    z.add_argument("--block-size", type=int, help="block length (default: the model's training length)")
    z.add_argument("--max-documents", type=int, help="use only the first N documents of each set (quick checks)")
    z.add_argument("--bpe-dir", metavar="DIR",
         help="folder with GPT-2's encoder.json and vocab.bpe (default: the checkpoint's, else DATA_ROOT/gpt2_bpe)")
    g = p.add_argument_group("generative perplexity and sample entropy")
    g.add_argument("--genppl", action="store_true", help="score samples with a scorer causal LM")
    g.add_argument("--scorer", "--reference", dest="scorer", metavar="PATH",
         help="scorer LM: a Hugging Face model directory, or a checkpoint of a causal model trained by tcsm "
              "(--reference: its old name)")
    g.add_argument("--samples", metavar="FILE", help="score these samples (jsonl from `tcsm sample`) instead of sampling")
    g.add_argument("--num-samples", type=int, default=16, help="samples per number of steps (default 16)")
    g.add_argument("--steps", help="sampling steps; a comma-separated list gives a curve (default: 128 for --genppl, "
                   "the run's sample.steps for --task)")
    g.add_argument("--method", help="sampler, one of `tcsm sample --method`'s (default: the run's sample.method)")
    g.add_argument("--drafter", metavar="PATH", help="--method speculative: the drafter's run / checkpoint / exported "
                   "directory, or ngram (default: the run's sample.drafter, else the model drafts from its last pass)")
    g.add_argument("--draft-length", type=int, help="--method speculative: positions drafted per model pass")
    g.add_argument("--temperature", type=float, help="sampling temperature (default: the run's sample.temperature)")
    g.add_argument("--top-p", type=float, help="nucleus mass in (0, 1] (default: the run's sample.top_p)")
    g.add_argument("--seed", type=int, default=0, help="seed of the samples")
    g.add_argument("--plot", metavar="PNG", help="plot gen-PPL and entropy against steps to this file")
    k = p.add_argument_group("task accuracy (docs/tasks.md); the sampler flags above apply")
    k.add_argument("--task", metavar="NAME", help="verifiable task: sudoku, countdown or addition")
    k.add_argument("--confidence", type=float, default=0.95, help="level of the Wilson interval (default 0.95)")
    k.add_argument("--show", type=int, default=0, metavar="N", help="print the first N completions and rewards")


def run(args) -> int:
    if sum(bool(getattr(args, k, None)) for k in ("zeroshot", "genppl", "task")) > 1:
        raise ValueError("give one of --zeroshot, --genppl and --task")
    if args.output:  # every mode: a bad --output fails before the work, not after it
        from tcsm.cli.common import check_writable

        check_writable(args.output, overwrite=args.overwrite)
    if getattr(args, "zeroshot", None):
        return _run_zeroshot(args)
    if getattr(args, "genppl", False):
        return _run_genppl(args)
    if getattr(args, "task", None):
        from tcsm.cli.evaltask import run_task

        return run_task(args)
    return _run_bound(args)


# --------------------------------------------------------------------------------------------------- shared


def _load(args, device):
    from tcsm.builders.loading import load_checkpoint

    return load_checkpoint(args.checkpoint, device=device, ema=args.weights != "model", overrides=list(args.overrides))


def _check_positive(**values) -> None:
    for name, v in values.items():
        if v is not None and v < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {v}")


# --------------------------------------------------------------------------------------------------- zero-shot


def _run_zeroshot(args) -> int:
    from pathlib import Path

    import torch
    from omegaconf import OmegaConf

    from tcsm.core.precision import autocast as _autocast
    from tcsm.data import gpt2_tokenizer
    from tcsm.evaluation.zeroshot import (
        ZEROSHOT_SETS,
        default_data_root,
        prepare_zeroshot,
        zeroshot_perplexity,
    )
    from tcsm.train.distributed import resolve_device

    names = list(ZEROSHOT_SETS) if args.zeroshot == "all" else [s.strip() for s in args.zeroshot.split(",")]
    unknown = [n for n in names if n not in ZEROSHOT_SETS]
    if unknown or not names:
        raise ValueError(f"unknown zero-shot set {unknown[0] if unknown else ''!r}; choose from {list(ZEROSHOT_SETS)} or all")
    _check_positive(block_size=args.block_size, max_documents=args.max_documents, num_t=args.num_t,
                    batch_size=args.batch_size)
    device = resolve_device(args.device)
    ckpt = _load(args, device)
    path = ckpt.build_path()
    if path.vocab_size != 50257:
        raise ValueError(
            f"zero-shot perplexity needs a GPT-2-BPE model (50257 tokens); this checkpoint has {path.vocab_size}"
        )
    root = Path(args.data_root) if args.data_root else default_data_root()
    data_cfg = OmegaConf.to_container(ckpt.config.data, resolve=True)
    bpe_dir = args.bpe_dir or data_cfg.get("bpe_dir") or str(root / "gpt2_bpe")
    tok = gpt2_tokenizer(bpe_dir, None if args.bpe_dir else data_cfg.get("encoder_json"),
                         None if args.bpe_dir else data_cfg.get("vocab_bpe"))
    L = args.block_size or int(ckpt.data_info["seq_len"])
    max_len = getattr(getattr(ckpt.model, "cfg", None), "max_len", None)
    if max_len is not None and L > max_len:
        raise ValueError(f"--block-size {L} exceeds the model's maximum length {max_len}")
    e = ckpt.config.eval
    num_t = args.num_t or e.num_t
    generator = torch.Generator(device=device).manual_seed(e.seed)
    results, lines = {}, [f"{ckpt.directory} (step {ckpt.step}, {ckpt.weights} weights), zero-shot, L={L}:"]
    for name in names:
        data = prepare_zeroshot(name, tok, block_size=L, eos_id=tok.eos_id, bos_id=tok.eos_id, layout=args.layout,
                                data_root=root, max_documents=args.max_documents)
        with _autocast(device, args.precision):
            r = zeroshot_perplexity(ckpt.model, path, data, batch_size=args.batch_size or e.batch_size,
                                    num_t=num_t, generator=generator, bound=args.bound or e.bound, device=device,
                                    progress=not args.json)
        results[name] = r
        lines.append(f"  {r['label']:<24} PPL <= {r['ppl_bound']:.2f} ± {r['ppl_bound_stderr']:.2f} "
                     f"({r['num_blocks']} blocks, {r['bound']} bound, {num_t} t per block)")
    emit_report(args, {"checkpoint": str(ckpt.directory), "step": ckpt.step, "weights": ckpt.weights,
                 "precision": args.precision, "zeroshot": results}, lines)
    return 0


# --------------------------------------------------------------------------------------------------- gen-PPL


def _read_samples(path: str) -> list[dict]:
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f):
                if line.strip():
                    row = json.loads(line)
                    if not isinstance(row, dict) or "text" not in row:
                        raise ValueError(f"{path}: line {i + 1} has no \"text\" field (write it with --format jsonl)")
                    rows.append(row)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON lines ({e.msg} at line {e.lineno})") from None
    if not rows:
        raise ValueError(f"{path}: no samples")
    return rows


def _score(ref, texts: list[str], tokens, max_length, batch_size) -> dict:
    from tcsm.evaluation.genppl import generative_perplexity, sample_entropy

    if ref.encode is not None:
        res = generative_perplexity(ref, texts=texts, max_length=max_length, batch_size=batch_size)
    else:
        res = generative_perplexity(ref, token_ids=tokens, batch_size=batch_size)
    return {**res.to_dict(), "entropy_mean": sample_entropy(tokens)["entropy_mean"]}


def _run_genppl(args) -> int:
    import torch

    from tcsm.builders.loading import load_drafter, load_scorer_lm
    from tcsm.cli.sample import load_tokenizer
    from tcsm.sampling.common import row_evaluations
    from tcsm.sampling.settings import draw, sample_settings
    from tcsm.train.distributed import resolve_device

    if not args.scorer:
        raise ValueError("--genppl needs --scorer (a Hugging Face model directory or a causal-LM checkpoint)")
    try:
        steps = [int(s) for s in (args.steps or "128").split(",")]
    except ValueError:
        raise ValueError(f"--steps must be a comma-separated list of integers, got {args.steps!r}") from None
    _check_positive(num_samples=args.num_samples, batch_size=args.batch_size, steps=min(steps))
    if (args.temperature is not None and not args.temperature > 0) or (
        args.top_p is not None and not 0 < args.top_p <= 1
    ):
        raise ValueError("--temperature must be > 0 and --top-p in (0, 1]")
    device = resolve_device(args.device)
    ref = load_scorer_lm(args.scorer, device)
    batch = args.batch_size or 8
    rows, lines, settings = [], [], None
    if args.samples:
        samples = _read_samples(args.samples)
        texts = [s["text"] for s in samples]
        tokens = [s.get("tokens") or [] for s in samples]
        row = {"samples": args.samples, "num_samples": len(samples), **_score(ref, texts, tokens, None, batch)}
        rows.append(row)
        lines.append(f"{args.samples}: gen-PPL {row['gen_ppl']:.2f} under {ref.name}, "
                     f"entropy {row['entropy_mean']:.3f} nats ({len(samples)} samples)")
        header = {"samples": args.samples}
    else:
        ckpt = _load(args, device)
        path = ckpt.build_path()
        tok = load_tokenizer(ckpt)
        L = int(ckpt.data_info["seq_len"])
        drafter_model = None
        lines.append(f"{ckpt.directory} (step {ckpt.step}, {ckpt.weights} weights), scorer {ref.name}:")
        for K in steps:
            settings = sample_settings(ckpt.config.sample, steps=K, method=args.method, temperature=args.temperature,
                                       top_p=args.top_p, drafter=getattr(args, "drafter", None),
                                       draft_length=getattr(args, "draft_length", None))  # fmt: skip
            if settings.drafter and settings.method == "speculative" and drafter_model is None:
                drafter_model = load_drafter(settings.drafter, device, path.vocab_size, ckpt, settings)
            generator = torch.Generator(device=device).manual_seed(args.seed)
            t0, outs, calls, evals = time.perf_counter(), [], 0, 0
            spec = {"sequence_passes": 0, "drafted": 0, "accepted": 0}
            for s in range(0, args.num_samples, batch):
                x, st = draw(ckpt.model, path, min(batch, args.num_samples - s), L, settings, generator=generator,
                             device=device, drafter_model=drafter_model)
                outs.append(x.cpu())
                calls += st.num_calls
                evals += row_evaluations(st, x.shape[0])
                for key in spec:  # speculative decoding's counts (MATH.md §6.4)
                    spec[key] += int(st.counts.get(key, 0)) if hasattr(st, "counts") else 0
            seconds = time.perf_counter() - t0
            tokens = torch.cat(outs).tolist()
            texts = [tok.decode(r) for r in tokens]
            row = {"steps": K, "method": st.method, "num_samples": len(tokens), "network_calls": calls,
                   "network_calls_per_sequence": evals / max(len(tokens), 1),
                   "sample_seconds": seconds, **_score(ref, texts, tokens, L, batch)}
            if spec["drafted"]:
                row.update(sequential_passes_per_sequence=spec["sequence_passes"] / max(len(tokens), 1),
                           acceptance=spec["accepted"] / spec["drafted"])  # fmt: skip
            rows.append(row)
            lines.append(f"  K={K:<5} gen-PPL {row['gen_ppl']:9.2f}  entropy {row['entropy_mean']:.3f} nats  "
                         f"({len(tokens)} samples, {calls} network calls (batched; "
                         f"{row['network_calls_per_sequence']:.1f} per sequence), {seconds:.1f}s)")
            if args.json:  # progress for long curves, kept off stdout so that it stays one JSON object
                print(f"  K={K}: gen-PPL {row['gen_ppl']:.2f}", file=sys.stderr)
        header = {"checkpoint": str(ckpt.directory), "step": ckpt.step, "weights": ckpt.weights}
        if args.plot and len(rows) > 0:
            from tcsm.evaluation.report import plot_genppl_vs_steps

            plot_genppl_vs_steps(rows, args.plot, title=f"{ckpt.directory.name} vs {ref.name}")
            lines.append(f"  plot: {args.plot}")
    temperature, top_p = (args.temperature, args.top_p) if settings is None else (settings.temperature, settings.top_p)
    emit_report(args, {**header, "scorer": ref.name, "temperature": temperature, "top_p": top_p,
                 "seed": args.seed, "genppl": rows}, lines)
    return 0
