"""`tcsm eval RUN --task NAME`: accuracy on a verifiable task's held-out problems with a Wilson interval
(tcsm.evaluation.tasks), at the run's sampler or the one the flags choose, for one or several step counts.

The problems are the first --max-examples (default 500) of the task's test split drawn with seed 0 — pinned, the
same for every run with the task's options (those of the run's data section when it trained on this task, else the
task's defaults) — so accuracies of different runs compare on the same prompts."""

from __future__ import annotations

import sys
import time

#: held-out problems per evaluation when --max-examples is not given
DEFAULT_PROBLEMS = 500


def run_task(args) -> int:
    import torch

    from tcsm.builders.assemble import build_objective_for_checkpoint
    from tcsm.builders.components import DataInfo
    from tcsm.builders.loading import load_checkpoint
    from tcsm.cli.common import emit_report
    from tcsm.cli.sample import load_tokenizer
    from tcsm.core.errors import ConfigError, TCSMError
    from tcsm.core.precision import autocast
    from tcsm.data.tasks import TASKS, TaskReward, make_task, run_task_options
    from tcsm.evaluation.tasks import sampler_completions, task_accuracy
    from tcsm.models.kinds import kind_of
    from tcsm.sampling.settings import sample_settings
    from tcsm.train.distributed import resolve_device

    if args.task not in TASKS:
        raise ConfigError(f"unknown --task {args.task!r}; choose one of {sorted(TASKS)}")
    try:
        steps = [None] if args.steps is None else [int(s) for s in str(args.steps).split(",")]
    except ValueError:
        raise ConfigError(f"--steps must be a comma-separated list of integers, got {args.steps!r}") from None
    n = DEFAULT_PROBLEMS if args.max_examples is None else args.max_examples
    for flag, v in (("--max-examples", n), ("--batch-size", args.batch_size), *(("--steps", k) for k in steps)):
        if v is not None and v < 1:
            raise ConfigError(f"{flag} must be a positive integer, got {v}")
    if not 0 < args.confidence < 1:
        raise ConfigError(f"--confidence must be in (0, 1), e.g. 0.95; got {args.confidence}")
    device = resolve_device(args.device)
    ckpt = load_checkpoint(args.checkpoint, device=device, ema=args.weights != "model", overrides=list(args.overrides))
    kind = kind_of(ckpt.model)
    if not (kind.is_denoiser or kind.is_autoregressive):
        raise ConfigError(f"{ckpt.directory} holds {kind.description}: --task needs a model that completes prompts "
                          "(a diffusion denoiser or a causal LM)")  # fmt: skip
    task = make_task(args.task, **run_task_options(ckpt.config.data).get(args.task, {}))
    tok = load_tokenizer(ckpt)
    reward = TaskReward(task, decode=tok.decode, vocab_size=tok.vocab_size)
    length = int(ckpt.data_info["seq_len"])
    if length < task.prompt_len + task.answer_len:
        raise ConfigError(f"{ckpt.directory} models sequences of {length} tokens; task {task.name} needs "
                          f"{task.prompt_len + task.answer_len} (prompt and answer): train on data.kind=task "
                          f"data.task={task.name}")  # fmt: skip
    try:
        objective = build_objective_for_checkpoint(ckpt.config, ckpt.model, DataInfo(**ckpt.data_info), device)
    except TCSMError:  # only energy and causal runs sample through their objective, and neither needs a reference
        objective = None
    batch = args.batch_size or 64
    head = f"{ckpt.directory} (step {ckpt.step}, {ckpt.weights} weights), task {task!r}, {n} held-out problems:"
    rows, lines = [], [head]
    for K in steps:
        settings = sample_settings(ckpt.config.sample, steps=K, method=args.method, temperature=args.temperature,
                                   top_p=args.top_p)  # fmt: skip
        generator = torch.Generator(device=device).manual_seed(args.seed)
        complete = sampler_completions(ckpt.model, ckpt.build_path(), settings, length, generator=generator,
                                       device=device, objective=objective)  # fmt: skip
        t0 = time.perf_counter()
        with autocast(device, args.precision):
            acc = task_accuracy(complete, task, reward, n, batch_size=batch, confidence=args.confidence)
        seconds = time.perf_counter() - t0
        own = kind.is_autoregressive
        row = {**acc.to_dict(), "method": complete.method, "steps": length - task.prompt_len if own else settings.steps,
               "temperature": settings.temperature, "top_p": settings.top_p, "network_calls": complete.calls,
               "seconds": seconds}  # fmt: skip
        rows.append(row)
        pct = args.confidence * 100
        lines.append(f"  {row['method']} sampler, {row['steps']} steps, temperature {settings.temperature:g}: accuracy "
                     f"{acc.accuracy:.3f} [{acc.ci_low:.3f}, {acc.ci_high:.3f}] ({pct:g}% Wilson), {acc.correct}/"
                     f"{acc.num_problems} correct, {complete.calls} network calls, {seconds:.1f}s")  # fmt: skip
        for i in range(min(args.show, acc.num_problems)):
            lines.append(f"    {acc.prompts[i]} {acc.completions[i]!r} -> {acc.rewards[i]:g}")
        if args.json and len(steps) > 1:  # progress on stderr, so stdout stays one JSON object
            print(f"  steps {row['steps']}: accuracy {acc.accuracy:.3f}", file=sys.stderr)
    result = {"checkpoint": str(ckpt.directory), "step": ckpt.step, "weights": ckpt.weights, "task": task.name,
              "options": task.options(), "split": "test", "seed": args.seed, "problem_seed": 0, "results": rows}
    emit_report(args, result, lines)
    return 0
