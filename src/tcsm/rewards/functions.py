"""Reward functions R: token sequences → scores, for reward fine-tuning toward p^R ∝ p_1 e^{R/β} (MATH.md §5.2).

A reward is any callable mapping a LongTensor[B, L] of clean token ids to a FloatTensor[B] (higher is better).
This module provides:

* `GridReward` — the paper's 2-D grid task: R = 0 on the left half of the grid, −10^5 on the right half;
* `TextReward` — wraps a scorer of decoded strings; `vader_reward` (VADER compound sentiment, in [−1, 1]) and
  `profanity_reward` (−P(profane) from `alt-profanity-check`) are offline PyPI scorers built on it;
* `HFClassifierReward` — a Hugging Face sequence classifier loaded from a local path (lazy `transformers`
  import; nothing is downloaded), scoring either token ids directly or re-tokenised decoded text;
* `task:NAME` — a verifiable task's 0/1 verifier on (prompt, completion) token ids (`tcsm.data.tasks`:
  sudoku, countdown, addition; options such as `task:countdown,count=4` are the task's);
* `make_reward(spec)` — builds any of these from a one-line spec (used by the CLI and configs).

Each kind of reward a spec can name is a `Reward` class registered in `REWARDS` (a `tcsm.core.parts.Parts` table):
its `name`, the option a spec may give without a key (`positional`), the data it is defined on (`scores`, checked
by `tcsm.rewards.domain`) and `from_spec`. A new reward is one such class and its `@REWARDS.register` line, in this
module or a module named in `REWARDS`' homes.

Rewards never hold gradients: they are evaluated under `torch.no_grad()` on (possibly many) candidate sequences.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import ClassVar

import torch
from torch import Tensor

from tcsm.core.parts import Parts

__all__ = [
    "REWARDS",
    "CallableReward",
    "GridReward",
    "HFClassifierReward",
    "Reward",
    "RewardFn",
    "TextReward",
    "evaluate_reward",
    "make_reward",
    "profanity_reward",
    "reward_specs",
    "vader_reward",
]

RewardFn = Callable[[Tensor], Tensor]

#: the rewards a spec can name (`make_reward`), by their `name`
REWARDS = Parts("reward", homes=("tcsm.rewards.functions",))


class Reward:
    """A kind of reward a spec names: `make_reward` builds it with `from_spec`."""

    name: ClassVar[str] = ""
    #: the option a spec gives first without a key ("hf:PATH", "task:NAME", "python:MODULE:FUNCTION"), or None
    positional: ClassVar[str | None] = None
    #: the data it is defined on: "tokens" (any), "text" (decoded text), "grid" (points of a W×W grid)
    scores: ClassVar[str] = "tokens"

    @classmethod
    def from_spec(cls, *, decode, vocab_size, task_options, **options) -> RewardFn:
        """The reward of a spec's `options`; `decode`, `vocab_size` and `task_options` as `make_reward` takes them."""
        return cls(**options)


def evaluate_reward(reward: RewardFn, x: Tensor, chunk_size: int | None = None) -> Tensor:
    """R(x) for x [..., L] in chunks of `chunk_size` rows; returns float32 [...] on x's device.

    Chunking bounds the memory of expensive rewards (classifiers) when N^1 asks for V·|M| calls per sequence.
    """
    lead, L = x.shape[:-1], x.shape[-1]
    flat = x.reshape(-1, L)
    n = flat.shape[0]
    step = n if not chunk_size or chunk_size <= 0 else int(chunk_size)
    outs = []
    with torch.no_grad():
        for s in range(0, max(n, 1), max(step, 1)):
            part = flat[s : s + step]
            if part.shape[0] == 0:
                continue
            r = torch.as_tensor(reward(part))
            if r.shape != (part.shape[0],):
                raise ValueError(
                    f"reward returned shape {tuple(r.shape)} for a batch of {part.shape[0]} sequences; "
                    "a reward must map LongTensor[B, L] to FloatTensor[B]"
                )
            outs.append(r.to(device=x.device, dtype=torch.float32))
    if not outs:
        return torch.zeros(lead, device=x.device)
    return torch.cat(outs).reshape(lead)


class CallableReward:
    """Adapter for a plain Python function on sequences; `per_sequence=True` calls it once per row with a list of
    ints (for scorers that are not batched)."""

    def __init__(self, fn: Callable, per_sequence: bool = False):
        self.fn, self.per_sequence = fn, per_sequence

    def __call__(self, x: Tensor) -> Tensor:
        if self.per_sequence:
            return torch.tensor([float(self.fn(row)) for row in x.tolist()], dtype=torch.float32)
        return torch.as_tensor(self.fn(x), dtype=torch.float32)


@REWARDS.register
class GridReward(Reward):
    """R(x) = `left` if the point's first coordinate x^0 < width/2, else `right` (paper App. E: 0 and −10^5).

    A grid point is a length-2 sequence (x^0, x^1) over {0..width−1}; "left half" means small x^0.
    """

    name, scores = "grid", "grid"

    def __init__(self, width: int = 128, left: float = 0.0, right: float = -1e5):
        self.width, self.left, self.right = int(width), float(left), float(right)

    def __call__(self, x: Tensor) -> Tensor:
        is_left = x[..., 0] < self.width // 2
        return torch.where(is_left, torch.tensor(self.left), torch.tensor(self.right)).float()

    @classmethod
    def from_spec(cls, *, decode, vocab_size, task_options, **options) -> GridReward:
        return cls(**{"width": vocab_size or 128, **options})


class TextReward:
    """R(x) = score(decode(x)): a batched scorer `score(list[str]) -> sequence of floats` on decoded text."""

    def __init__(self, score: Callable[[list[str]], Sequence[float]], decode: Callable[[list[int]], str]):
        self.score, self.decode = score, decode

    def __call__(self, x: Tensor) -> Tensor:
        texts = [self.decode(row) for row in x.tolist()]
        return torch.as_tensor([float(s) for s in self.score(texts)], dtype=torch.float32)


def _import_optional(module: str, package: str):
    try:
        return importlib.import_module(module)
    except ImportError as e:  # the message names the extra that provides it
        raise ImportError(
            f"this reward needs the `{package}` package: pip install 'tcsm[reward]' ({e})"
        ) from e


class _DecodedTextReward(TextReward, Reward):
    scores = "text"

    @classmethod
    def from_spec(cls, *, decode, vocab_size, task_options, **options) -> TextReward:
        return cls(_need_decode(decode, cls.name), **options)


@REWARDS.register
class VaderReward(_DecodedTextReward):
    """R(x) = VADER compound sentiment of the decoded text, in [−1, 1] (`vaderSentiment`, offline lexicon)."""

    name = "vader"

    def __init__(self, decode: Callable[[list[int]], str]):
        analyzer = _import_optional("vaderSentiment.vaderSentiment", "vaderSentiment").SentimentIntensityAnalyzer()
        super().__init__(lambda texts: [analyzer.polarity_scores(s)["compound"] for s in texts], decode)


@REWARDS.register
class ProfanityReward(_DecodedTextReward):
    """R(x) = −P(profane | decoded text), in [−1, 0] (`alt-profanity-check`, an offline linear classifier)."""

    name = "profanity"

    def __init__(self, decode: Callable[[list[int]], str]):
        predict_prob = _import_optional("profanity_check", "alt-profanity-check").predict_prob
        super().__init__(lambda texts: [-float(p) for p in predict_prob(list(texts))], decode)


def vader_reward(decode: Callable[[list[int]], str]) -> TextReward:
    """The `vader` reward of text decoded by `decode`."""
    return VaderReward(decode)


def profanity_reward(decode: Callable[[list[int]], str]) -> TextReward:
    """The `profanity` reward of text decoded by `decode`."""
    return ProfanityReward(decode)


@REWARDS.register
class HFClassifierReward(Reward):
    """R(x) = a Hugging Face sequence classifier's score for class `label` (MATH.md §5.2's generic R).

    `model` is a local path (loaded with `local_files_only=True`, never downloaded) or an already-built
    `PreTrainedModel`. If `tokenizer` (path or object) and `decode` are given, sequences are decoded and
    re-tokenised; otherwise token ids are fed to the classifier unchanged (shared vocabulary).
    `mode`: "logit" (the class logit), "logprob" (log-softmax) or "prob".
    """

    name, positional = "hf", "path"

    def __init__(
        self,
        model,
        label: int = 1,
        mode: str = "logprob",
        tokenizer=None,
        decode: Callable[[list[int]], str] | None = None,
        max_length: int = 512,
        device=None,
    ):
        if mode not in ("logit", "logprob", "prob"):
            raise ValueError(f"unknown classifier reward mode {mode!r}; choose logit, logprob or prob")
        transformers = _import_optional("transformers", "transformers")
        if isinstance(model, str):
            model = transformers.AutoModelForSequenceClassification.from_pretrained(
                model, local_files_only=True
            )
        if isinstance(tokenizer, str):
            tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)
        if tokenizer is not None and decode is None:
            raise ValueError("a classifier with its own tokenizer needs `decode` to turn token ids into text")
        self.model = model.eval().requires_grad_(False)
        if device is not None:
            self.model.to(device)
        self.label, self.mode, self.tokenizer, self.decode, self.max_length = (
            int(label),
            mode,
            tokenizer,
            decode,
            max_length,
        )

    def __call__(self, x: Tensor) -> Tensor:
        dev = next(self.model.parameters()).device
        with torch.no_grad():
            if self.tokenizer is None:
                logits = self.model(input_ids=x.to(dev)).logits
            else:
                enc = self.tokenizer(
                    [self.decode(r) for r in x.tolist()],
                    return_tensors="pt",
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                )
                logits = self.model(**{k: v.to(dev) for k, v in enc.items()}).logits
        logits = logits.float()
        if self.mode == "logit":
            out = logits[:, self.label]
        elif self.mode == "logprob":
            out = torch.log_softmax(logits, -1)[:, self.label]
        else:
            out = torch.softmax(logits, -1)[:, self.label]
        return out.to(x.device)

    @classmethod
    def from_spec(cls, *, decode, vocab_size, task_options, path, **options) -> HFClassifierReward:
        return cls(path, decode=decode, **options)


@REWARDS.register
class PythonReward(Reward):
    """A user's reward: "python:MODULE:FUNCTION", the function there on token ids [B, L] → [B] (called with the
    spec's options first when it is a factory taking them)."""

    name, positional = "python", "target"

    @classmethod
    def from_spec(cls, *, decode, vocab_size, task_options, target, **options) -> CallableReward:
        return _python_reward(target, **options)


@REWARDS.register
class TaskRewards(Reward):
    """"task:NAME": the 0/1 verifier of a verifiable task on (prompt, completion) ids (`tcsm.data.tasks`), with the
    run's own task options (`task_options`) as the defaults of a task of that name."""

    name, positional = "task", "task"

    @classmethod
    def from_spec(cls, *, decode, vocab_size, task_options, task=None, **options):
        from tcsm.data.tasks import TASKS, task_reward

        if task is None:
            raise ValueError(f"the task reward needs a task name: task:NAME with NAME one of {sorted(TASKS)}")
        options = {**(task_options or {}).get(task, {}), **options}
        return task_reward(task, decode=decode, vocab_size=vocab_size, **options)


def _python_reward(target: str, **kwargs):
    """`module:attr` → the callable there (called with kwargs first if it is a factory taking them)."""
    if ":" not in target:
        raise ValueError(f"python reward {target!r} must be 'module:function'")
    mod, attr = target.split(":", 1)
    try:
        module = importlib.import_module(mod)
    except Exception as e:  # noqa: BLE001 — the user's file: a syntax error or a failing import is one line
        where = f" ({e.filename}, line {e.lineno})" if isinstance(e, SyntaxError) else ""
        raise ValueError(f"python reward {target!r}: cannot import {mod!r}: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}{where}") from None  # fmt: skip
    if not hasattr(module, attr):
        raise ValueError(f"python reward {target!r}: module {mod!r} has no {attr!r}")
    fn = getattr(module, attr)
    return CallableReward(fn(**kwargs) if kwargs else fn)


def reward_specs() -> str:
    """The rewards a spec can name, for help texts: "grid | vader | ... | hf:PATH | task:TASK | python:TARGET"."""
    return " | ".join(f"{c.name}:{c.positional.upper()}" if c.positional else c.name for c in REWARDS.values())


def _need_decode(decode, name):
    if decode is None:
        raise ValueError(
            f"the {name!r} reward scores text: the model's tokenizer must be known to decode samples"
        )
    return decode


def _parse_value(v: str):
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(v.lower(), v)


def make_reward(
    spec: str | dict,
    decode: Callable[[list[int]], str] | None = None,
    vocab_size: int | None = None,
    task_options: dict[str, dict] | None = None,
) -> RewardFn:
    """Build a reward from a spec: "grid", "grid:width=64,right=-1e5", "vader", "profanity",
    "hf:/path/to/classifier,label=1,mode=logprob", "task:sudoku", "python:pkg.mod:fn"; or a dict {"name": ..., **kwargs}.

    `decode(list[int]) -> str` turns token ids into text for text scorers; `vocab_size` is the default grid width;
    `task_options` ({task name: options}, the run's task data) are the defaults of a task reward of that name, so
    "task:countdown" scores the run's own Countdown (its numbers' width, their count) unless the spec says otherwise.
    """
    if isinstance(spec, dict):
        spec = dict(spec)
        name = spec.pop("name", None)
        kwargs = spec
    else:
        name, _, rest = str(spec).partition(":")
        kwargs = {}
        parts = [p for p in rest.split(",") if p] if rest else []
        positional = REWARDS.get(name).positional if name in REWARDS else None
        # the first option may be the positional one, which may itself hold ':' (python:MODULE:FUNCTION)
        if positional and parts and "=" not in parts[0]:
            kwargs[positional] = parts.pop(0)
        for p in parts:
            if "=" not in p:
                raise ValueError(f"bad reward option {p!r} in {spec!r}; expected key=value")
            k, v = p.split("=", 1)
            kwargs[k.strip()] = _parse_value(v.strip())
    return REWARDS.get(name).from_spec(decode=decode, vocab_size=vocab_size, task_options=task_options, **kwargs)
