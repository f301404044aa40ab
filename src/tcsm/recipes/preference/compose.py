"""Preference fine-tuning as a recipe (MATH.md §5.3): pairs from a model's own samples, the fine-tune's run config,
and its before/after report.

* `sample_pairs` — pairs without human data: sample the pre-trained model in groups (with or without prompts),
  score every sample with a reward of `tcsm.rewards.functions`, keep the best and the worst of each group as chosen and
  rejected; `write_pairs` writes them in the `pairs` data kind's JSONL format (prompt / chosen / rejected).
* `preference_config` — an ordinary run: the pre-trained run's config (path, model) < the `finetune-preference`
  preset < overrides, with `data.kind: pairs` over the pairs file (tokenized with the pre-trained run's tokenizer),
  the frozen reference in `reference.path` and the student's start in `train.init_from`.
* `preference_report` — mean reward and sample entropy of the pre-trained and the fine-tuned model.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

from tcsm.builders.loading import load_checkpoint
from tcsm.core.errors import ConfigError
from tcsm.data.pairs import tokenizer_signature
from tcsm.data.tasks import run_task_options
from tcsm.evaluation.genppl import sample_entropy
from tcsm.recipes.records import records_config
from tcsm.recipes.spec import lazy_report
from tcsm.rewards.functions import evaluate_reward, make_reward
from tcsm.sampling.settings import SampleSettings, draw, sample_settings
from tcsm.storage.fileio import write_atomically

__all__ = ["preference_config", "preference_report", "sample_pairs", "write_pairs"]


# --------------------------------------------------------------------------------------------------- pairs


def _draw(model, path, n: int, length: int, settings, generator, prompt_ids) -> torch.Tensor:
    prompt = prompt_ids if prompt_ids is not None and prompt_ids.numel() else None
    return draw(model, path, n, length, settings, generator=generator, prompt=prompt, chunk_size=256)[0]


@torch.no_grad()
def sample_pairs(
    model,
    path,
    data,
    reward,
    num_pairs: int,
    *,
    group: int = 2,
    prompts=("",),
    settings=None,
    seed: int = 0,
    max_rounds: int = 20,
) -> tuple[list[dict], dict]:
    """(records, stats): `num_pairs` pairs {prompt, chosen, rejected, chosen_reward, rejected_reward}, spread over
    `prompts` in turn; each pair is the best and the worst of `group` samples with that prompt under `reward`.

    Groups whose best and worst rewards tie, or whose best and worst responses decode to the same text, carry no
    preference and are redrawn (up to `max_rounds` rounds); `stats` counts samples, reward calls and skips.
    Records also hold the sampled token ids and the tokenizer's signature (`tcsm.data.pairs.tokenizer_signature`).
    """
    settings = settings if settings is not None else SampleSettings(steps=64)  # the run's sampler, from tcsm pairs
    if group < 2:
        raise ConfigError(f"a pair needs a group of at least 2 samples, got {group}")
    if num_pairs < 1:
        raise ConfigError(f"the number of pairs must be >= 1, got {num_pairs}")
    prompts = list(prompts) or [""]
    L = int(data.seq_len)
    encoded = [data.encode(p) if p else torch.zeros(0, dtype=torch.long) for p in prompts]
    for p, ids in zip(prompts, encoded):
        if ids.numel() >= L:
            raise ConfigError(f"prompt {p!r} has {ids.numel()} tokens: no room for a response in {L}")
    want = [num_pairs // len(prompts) + (j < num_pairs % len(prompts)) for j in range(len(prompts))]
    generator = torch.Generator().manual_seed(int(seed))
    signature = tokenizer_signature(data)
    records: list[dict] = []
    stats = {"samples": 0, "reward_calls": 0, "ties_skipped": 0, "identical_skipped": 0, "rounds": 0}
    for _ in range(int(max_rounds)):
        if sum(want) == 0:
            break
        stats["rounds"] += 1
        for j, (text, ids) in enumerate(zip(prompts, encoded)):
            if want[j] == 0:
                continue
            x = _draw(model, path, want[j] * group, L, settings, generator, ids).cpu()
            r = evaluate_reward(reward, x, 1024).reshape(want[j], group)
            stats["samples"] += x.shape[0]
            stats["reward_calls"] += x.shape[0]
            x = x.reshape(want[j], group, L)
            best, worst = r.argmax(-1), r.argmin(-1)
            P = ids.numel()
            for g in range(want[j]):
                hi, lo = r[g, best[g]], r[g, worst[g]]
                if not hi > lo:
                    stats["ties_skipped"] += 1
                    continue
                chosen, rejected = data.decode(x[g, best[g], P:]), data.decode(x[g, worst[g], P:])
                if chosen == rejected:
                    stats["identical_skipped"] += 1
                    continue
                records.append(
                    {
                        "prompt": text,
                        "chosen": chosen,
                        "rejected": rejected,
                        "chosen_reward": float(hi),
                        "rejected_reward": float(lo),
                        # the exact sampled tokens, for a run with the same tokenizer (tcsm.data.pairs)
                        "tokenizer": signature,
                        "prompt_ids": ids.tolist(),
                        "chosen_ids": x[g, best[g], P:].tolist(),
                        "rejected_ids": x[g, worst[g], P:].tolist(),
                    }
                )
                want[j] -= 1
    stats["pairs"] = len(records)
    return records, stats


def write_pairs(records: list[dict], out: str | os.PathLike) -> Path:
    """Write `records` as JSON lines to `out`, atomically (a partial file never replaces a good one)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return out


# --------------------------------------------------------------------------------------------------- config


def preference_config(
    checkpoint, pairs, preset: str | None = "finetune-preference", overrides=(), values: dict | None = None
):
    """The fine-tuning config: pre-trained run's config < preset < overrides < `values` (dotted key → value),
    with `data` the pairs file tokenized by the pre-trained run's tokenizer, `reference.path` and
    `train.init_from` the checkpoint directory (set train.init_from=null in `values` to start afresh)."""
    return records_config(
        checkpoint, "preference", "pairs", pairs, preset, overrides, values, what="a preference fine-tune",
        is_dir="preference pairs {path!r} is a directory; give the JSONL file `tcsm pairs` wrote",
        missing="preference pairs file not found: {path} (write one with `tcsm pairs`)", frozen_reference=True,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------------- report


def check_eval_reward(reward: str, cfg) -> None:
    """ConfigError before training when the `--eval-reward` of a fine-tune with config `cfg` is not defined on the
    reference run's data (tcsm.rewards.domain.check_reward_domain): the report would otherwise fail, or judge noise,
    only after training."""
    from types import SimpleNamespace

    from tcsm.rewards.domain import check_reward_domain
    from tcsm.storage.checkpoint import read_state, resolve_checkpoint

    state = read_state(resolve_checkpoint(cfg.reference.path))[1]
    data = dict(state["config"].get("data") or {})
    if data.get("kind") == "pairs":
        data = dict(data.get("tokenizer") or {})
    info = state.get("data_info") or {}
    shape = SimpleNamespace(
        config=SimpleNamespace(data=SimpleNamespace(kind=data.get("kind"))),
        vocab_size=info.get("vocab_size"),
        seq_len=info.get("seq_len"),
    )
    check_reward_domain(reward, shape, what="--eval-reward ")



def preference_report(
    run_dir,
    num_samples: int,
    reward: str,
    *,
    prompt: str | None = None,
    steps: int | None = None,
    seed: int = 0,
) -> dict:
    """Mean reward (± s.e.) and mean unigram entropy of the response tokens of `num_samples` samples of the
    reference and of the fine-tuned (EMA) model, same sampler and seed; plus the run's last held-out metrics."""
    post = load_checkpoint(run_dir)
    cfg = post.config
    pre = load_checkpoint(cfg.reference.path, ema=cfg.reference.ema)
    data, path = post.build_data(), post.build_path()
    try:
        reward_fn = make_reward(reward, decode=data.decode, vocab_size=data.vocab_size,
                                task_options=run_task_options(cfg.data))
    except (ValueError, ImportError) as e:
        raise ConfigError(f"--eval-reward: {e}") from None
    ids = data.encode(prompt) if prompt else None
    P = 0 if ids is None else ids.numel()
    steps = int(steps or cfg.sample.steps)
    out = {"reward": reward, "num_samples": int(num_samples), "sample_steps": steps, "prompt": prompt or ""}
    for name, ck in (("reference", pre), ("finetuned", post)):
        settings = sample_settings(cfg.sample, steps=steps)
        x = _draw(ck.model, path, num_samples, data.seq_len, settings, torch.Generator().manual_seed(seed), ids)
        r = evaluate_reward(reward_fn, x, 1024).double()
        out[f"{name}_reward_mean"] = float(r.mean())
        out[f"{name}_reward_stderr"] = float(r.std() / math.sqrt(max(1, r.numel())))
        out[f"{name}_entropy"] = float(sample_entropy(x[:, P:])["entropy_mean"])
        out[f"{name}_example"] = data.decode(x[0])
    summary = Path(run_dir) / "summary.json"
    if summary.is_file():
        held = json.loads(summary.read_text(encoding="utf-8"))
        out.update({k: held[k] for k in ("pref_accuracy", "reward_margin", "kl_ref") if k in held})
    return out


def compose(args, config: str, values: dict):
    """`tcsm finetune preference`'s run config from its arguments."""
    if not args.checkpoint or not args.pairs:
        raise ConfigError(
            "give the pre-trained model and the pairs: tcsm finetune preference --from RUN --pairs FILE "
            "(or --resume -o DIR)"
        )
    return preference_config(args.checkpoint, args.pairs, config, args.overrides, values)


def report_of(args):
    if not args.eval_reward:
        return None
    return lazy_report("tcsm.recipes.preference.compose:preference_report", args.eval_samples, args.eval_reward,
                       prompt=args.eval_prompt)  # fmt: skip
