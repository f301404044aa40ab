"""Accuracy on a verifiable task's held-out problems (`tcsm.data.tasks`) with a confidence interval.

The model completes pinned prompts (the test split's first n problems, a function of the task's options alone), the
task's verifier scores each completion 0 or 1, and accuracy = k / n comes with Wilson's score interval for a
binomial proportion: p̂ and the interval { p : |p̂ − p| ≤ z √(p(1 − p)/n) }, z the normal quantile of the confidence
level — valid at k = 0 and k = n, where the normal-approximation interval collapses to a point.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from statistics import NormalDist

import torch
from torch import Tensor

from tcsm.data.tasks import Task, TaskReward
from tcsm.sampling.settings import draw

__all__ = ["TaskAccuracy", "sampler_completions", "task_accuracy", "wilson_interval"]


def wilson_interval(correct: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson's score interval for a proportion from `correct` successes in `n` trials:
    (p̂ + z²/2n ± z √(p̂(1−p̂)/n + z²/4n²)) / (1 + z²/n)."""
    if n < 1 or not 0 <= correct <= n:
        raise ValueError(f"a proportion needs 0 <= correct <= n and n >= 1, got {correct} of {n}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p, z2 = correct / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    # at k = 0 (k = n) the bound is exactly 0 (1); rounding would leave a residue of 1e-17
    return (0.0 if correct == 0 else max(0.0, centre - half)), (1.0 if correct == n else min(1.0, centre + half))


@dataclass
class TaskAccuracy:
    """k correct of n held-out problems, accuracy k / n and its Wilson interval at `confidence`; `rewards` per
    problem in the order of the pinned `prompts`, `completions` their text (up to the end of text)."""

    task: str
    num_problems: int
    correct: int
    accuracy: float
    ci_low: float
    ci_high: float
    confidence: float
    rewards: list[float]
    prompts: list[str]
    completions: list[str]

    def to_dict(self, with_completions: bool = False) -> dict:
        d = asdict(self)
        if not with_completions:
            for key in ("rewards", "prompts", "completions"):
                d.pop(key)
        return d


def task_accuracy(
    complete: Callable[[Tensor], Tensor],
    task: Task,
    reward: TaskReward,
    num_problems: int,
    *,
    batch_size: int = 64,
    confidence: float = 0.95,
    seed: int = 0,
) -> TaskAccuracy:
    """Accuracy of `complete(prompt_ids [b, P]) -> completion_ids [b, C]` on the first `num_problems` problems of
    `task`'s test split (drawn with `seed`), scored by `reward` (the verifier on the run's token ids)."""
    examples = task.examples("test", int(num_problems), seed=seed)
    rewards, texts = [], []
    for s in range(0, len(examples), max(1, int(batch_size))):
        chunk = examples[s : s + int(batch_size)]
        prompts = torch.tensor([reward.encode(ex.prompt) for ex in chunk], dtype=torch.long)
        completions = complete(prompts)
        rewards += reward.score(prompts, completions).tolist()
        texts += [reward.answer_text(row) for row in completions.tolist()]
    k = int(sum(r == 1.0 for r in rewards))
    lo, hi = wilson_interval(k, len(rewards), confidence)
    prompts = [ex.prompt for ex in examples]
    return TaskAccuracy(task.name, len(rewards), k, k / len(rewards), lo, hi, confidence, rewards, prompts, texts)


def sampler_completions(model, path, settings, length: int, *, generator=None, device=None, objective=None):
    """`complete` for `task_accuracy`: the sampler `settings` choose draws `length`-token sequences with each prompt
    pinned at the start; returns the positions after it. `.calls` counts the network calls made."""

    def complete(prompts: Tensor) -> Tensor:
        b, P = prompts.shape
        if P >= length:
            raise ValueError(f"prompts of {P} tokens leave no room to answer in sequences of {length}")
        fixed = torch.zeros(b, length, dtype=torch.bool, device=device)
        fixed[:, :P] = True
        values = torch.zeros(b, length, dtype=torch.long, device=device)
        values[:, :P] = prompts.to(device)
        with torch.no_grad():
            x, stats = draw(model, path, b, length, settings, objective=objective, generator=generator,
                            device=device, fixed=fixed, values=values)  # fmt: skip
        complete.calls += stats.num_calls
        complete.method = stats.method
        return x[:, P:].cpu()

    complete.calls, complete.method = 0, None
    return complete
