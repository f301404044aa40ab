"""Task accuracy and its Wilson interval, on completers and models whose answers the test controls."""

import math

import pytest
import torch

from tcsm.data.tasks import make_task, task_reward
from tcsm.evaluation.tasks import sampler_completions, task_accuracy, wilson_interval
from tcsm.paths import MaskedPath
from tcsm.sampling.settings import SampleSettings


def test_wilson_interval_matches_its_closed_form_and_known_values():
    # R's prop.test(x, n, correct=FALSE)$conf.int / statsmodels proportion_confint(method="wilson")
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.27753279), abs=1e-7)
    assert wilson_interval(10, 10) == pytest.approx((0.72246721, 1.0), abs=1e-7)
    assert wilson_interval(5, 10) == pytest.approx((0.23659309, 0.76340691), abs=1e-7)
    lo, hi = wilson_interval(81, 100, confidence=0.9)
    z, p, n = 1.6448536269514722, 0.81, 100
    centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert (lo, hi) == pytest.approx((centre - half, centre + half), abs=1e-12)
    assert wilson_interval(30, 100, 0.99)[1] - wilson_interval(30, 100, 0.99)[0] > hi - lo  # wider at a higher level
    for bad in ((3, 2), (-1, 2), (0, 0)):
        with pytest.raises(ValueError):
            wilson_interval(*bad)


def _oracle(task, reward, right: set[int], examples):
    """A completer answering the reference answer to the problems whose index is in `right`, a wrong one else."""
    index = {ex.prompt: i for i, ex in enumerate(examples)}
    C = task.seq_len - task.prompt_len

    def complete(prompts):
        rows = []
        for p in prompts.tolist():
            i = index["".join(reward.table[t] for t in p)]
            answer = examples[i].answer if i in right else examples[(i + 1) % len(examples)].answer
            rows.append(reward.encode((answer + "\n" * C)[:C]))
        return torch.tensor(rows)

    return complete


@pytest.mark.parametrize("name", ["sudoku", "countdown", "addition"])
def test_accuracy_counts_exactly_the_answers_the_model_gets_right(name):
    task, reward = make_task(name), task_reward(name)
    examples = task.examples("test", 40, seed=0)
    right = set(range(0, 40, 3))
    wrong_but_valid = {i for i in range(40) if i not in right and task.score_text(examples[i].prompt, examples[(i + 1) % 40].answer)}
    acc = task_accuracy(_oracle(task, reward, right, examples), task, reward, 40, batch_size=7)
    k = len(right) + len(wrong_but_valid)
    assert (acc.num_problems, acc.correct, acc.accuracy) == (40, k, k / 40)
    assert (acc.ci_low, acc.ci_high) == wilson_interval(k, 40)
    assert [i for i, r in enumerate(acc.rewards) if r == 1.0] == sorted(right | wrong_but_valid)
    assert acc.prompts == [ex.prompt for ex in examples]
    assert acc.completions[0] == examples[0].answer and "completions" not in acc.to_dict()


class _AnswerModel(torch.nn.Module):
    """A denoiser certain of one token per position (the sequence `target`), whatever it is shown."""

    def __init__(self, target: torch.Tensor, vocab_size: int):
        super().__init__()
        self.register_buffer("logits", torch.full((target.numel(), vocab_size), -30.0).scatter(1, target[:, None], 30.0))

    def forward(self, x, t, **_):
        return self.logits.expand(x.shape[0], -1, -1).clone()


def test_sampler_completions_pin_the_prompt_and_return_what_the_model_writes():
    task, reward = make_task("addition", digits=2), task_reward("addition", digits=2)
    ex = task.examples("test", 1, seed=0)[0]
    tok = task.tokenizer()
    # the model always writes the first problem's sequence: right on that prompt, and the prompt stays pinned
    model = _AnswerModel(torch.tensor(tok.encode(task.text(ex))), tok.vocab_size)
    path = MaskedPath(tok.vocab_size)
    complete = sampler_completions(model, path, SampleSettings(steps=4), task.seq_len, generator=torch.Generator().manual_seed(0))
    acc = task_accuracy(complete, task, reward, 12, batch_size=5)
    assert acc.rewards[0] == 1.0 and acc.completions[0] == ex.answer
    expected = [task.score_text(p, ex.answer) for p in acc.prompts]  # the same answer under every other prompt
    assert acc.rewards == expected and acc.correct == sum(expected) and complete.calls > 0
    with pytest.raises(ValueError, match="no room"):
        sampler_completions(model, path, SampleSettings(steps=4), task.prompt_len)(torch.zeros(1, task.prompt_len, dtype=torch.long))
