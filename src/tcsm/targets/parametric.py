"""Parametric targets: a frozen LM of the data p_1 gives the exact N^1 target (MATH.md §4).

A *teacher* maps clean x_1 [B, L] to log p_1(y | x_1^{≠i}) [B, L, V]; `ParametricTarget` then forms
q^i ∝ p_1(· | x_1^{≠i}) k_t(x_t^i | ·) with `path.target_conditional` (masked and uniform sources alike), and the
objectives train the student against this explicit distribution instead of the single observed token.

* `MLMTeacher`: BERT-style; x^i replaced by [MASK], one pass per position, batched (B·L sequences);
* `HollowTeacher`: one pass gives all L conditionals;
* `ARTeacher`: log_softmax of an `ARScoreEstimator`'s log concrete scores (exact / Top-K / Taylor).

Teachers are frozen (eval mode, no parameter gradients) and run under no_grad. The teacher conditionals depend
on x_1 only — not on t or x_t — so `ParametricTarget(cache_size=n)` memoises them per sequence: with a finite
training set every sequence is scored once. `load_teacher(checkpoint)` wraps an LM trained by
`tcsm train`; importing this module registers `target.name: parametric` with `tcsm.builders.registry.TARGETS`.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict

import torch
from torch import Tensor, nn

from tcsm.core.parts import Parts
from tcsm.models.kinds import kind_of
from tcsm.paths import ProbabilityPath
from tcsm.targets.ar import ARScoreEstimate, ARScoreEstimator, estimator_options, make_ar_estimator, sample_ar
from tcsm.targets.base import ConditionalTarget, TargetBatch

__all__ = [
    "ARTeacher",
    "HollowTeacher",
    "MLMTeacher",
    "ParametricTarget",
    "Teacher",
    "make_teacher",
    "mlm_conditionals",
]


def mlm_conditionals(model: nn.Module, x1: Tensor, max_tokens: int = 1 << 16) -> Tensor:
    """log p(x^i = · | x^{≠i}) [B, L, V] from a masked LM: L copies of each sequence, copy i with x^i ← [MASK],
    one batched pass (chunked to about `max_tokens` tokens) and position i read from copy i (MATH.md §4)."""
    L = x1.shape[1]
    pos = torch.arange(L, device=x1.device)
    rows = max(1, int(max_tokens) // (L * L))  # sequences of the batch per chunk (each becomes L copies)
    out = []
    for xb in x1.split(rows):
        copies = xb[:, None, :].repeat(1, L, 1)
        copies[:, pos, pos] = model.mask_id
        logits = model(copies.reshape(-1, L)).view(xb.shape[0], L, L, -1)
        out.append(torch.log_softmax(logits[:, pos, pos].float(), dim=-1))
    return torch.cat(out)


class Teacher:
    """A frozen LM: `__call__(x1)` → log p_1(y | x_1^{≠i}) [B, L, V] (MATH.md §4).

    Teachers run in float32 even inside a trainer's bf16 autocast (`autocast=False`): the AR marginal sums L
    log-probability differences, where bf16 rounding would add up to a visible error in the target.
    """

    #: the keyword options this teacher takes besides `autocast` (a config's target section may hold more)
    OPTIONS: tuple[str, ...] = ()

    @classmethod
    def accepted(cls, options: dict) -> dict:
        """The entries of `options` this teacher takes."""
        return {k: v for k, v in options.items() if k in cls.OPTIONS or k == "autocast"}

    def __init__(self, model: nn.Module, autocast: bool = False):
        self.model = model.eval()
        self.autocast = bool(autocast)
        for p in self.model.parameters():
            p.requires_grad_(False)

    @property
    def vocab_size(self) -> int:
        return int(self.model.vocab_size)

    def conditionals(self, x1: Tensor) -> Tensor:
        raise NotImplementedError

    @contextlib.contextmanager
    def frozen(self, device_type: str):
        """Eval mode, no gradients and (unless `autocast`) float32: how every teacher call runs."""
        self.model.eval()  # a trainer's model.train() elsewhere must not switch dropout on in the teacher
        off = contextlib.nullcontext() if self.autocast else torch.autocast(device_type, enabled=False)
        with torch.no_grad(), off:
            yield self.model

    def __call__(self, x1: Tensor) -> Tensor:
        with self.frozen(x1.device.type):
            return self.conditionals(x1).float()

    def to(self, device) -> Teacher:
        self.model.to(device)
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self.model).__name__})"


class MLMTeacher(Teacher):
    """p_1(· | x^{≠i}) = MLM head at i with x^i ← [MASK]: L masked copies per sequence, batched (MATH.md §4)."""

    OPTIONS = ("max_tokens",)

    def __init__(self, model: nn.Module, max_tokens: int = 1 << 16, autocast: bool = False):
        super().__init__(model, autocast)
        self.max_tokens = int(max_tokens)

    def conditionals(self, x1):
        return mlm_conditionals(self.model, x1, self.max_tokens)


class HollowTeacher(Teacher):
    """All L conditionals from one pass of a Hollow transformer (MATH.md §4)."""

    def conditionals(self, x1):
        return torch.log_softmax(self.model(x1).float(), dim=-1)


class ARTeacher(Teacher):
    """p^AR(y | x^{≠i}) = softmax_y ℓ^i(y) with ℓ from an `ARScoreEstimator` (MATH.md §4, §5.4)."""

    OPTIONS = ("estimator", "k", "temperature", "max_tokens")

    @classmethod
    def accepted(cls, options: dict) -> dict:
        """The options the chosen estimator takes (`targets.ar.estimator_options`: exact has no Top-K nor
        temperature, Taylor no K nor token budget)."""
        opts = super().accepted(options)
        takes = estimator_options(opts.get("estimator", "exact"))
        return {k: v for k, v in opts.items() if k == "estimator" or k in takes}

    def __init__(
        self,
        model: nn.Module,
        estimator: str | ARScoreEstimator = "exact",
        autocast: bool = False,
        **estimator_kwargs,
    ):
        super().__init__(model, autocast)
        self.estimator = make_ar_estimator(estimator, **estimator_kwargs)

    def conditionals(self, x1):
        return self.estimator.conditionals(self.model, x1)

    def estimate(self, x1: Tensor) -> ARScoreEstimate:
        """The estimator's ℓ [B, L, V] and its cost per sequence (MATH.md §5.4), run like `__call__`."""
        with self.frozen(x1.device.type):
            return self.estimator.estimate(self.model, x1)

    def sample(self, num: int, length: int, generator: torch.Generator | None = None, device=None) -> Tensor:
        """x_1 ~ p^AR ancestrally with the key/value cache: LongTensor[num, length] (MATH.md §5.4, h = p^AR)."""
        device = next(self.model.parameters()).device if device is None else device
        with self.frozen(torch.device(device).type):
            return sample_ar(self.model, num, length, generator, device)

    def __repr__(self) -> str:
        return f"ARTeacher({type(self.model).__name__}, {self.estimator!r})"


TEACHERS = Parts("teacher family", {"mlm": MLMTeacher, "hollow": HollowTeacher, "causal": ARTeacher})


def make_teacher(model: nn.Module, family: str | None = None, **kwargs) -> Teacher:
    """Wrap an LM in the teacher of its family ("mlm" | "hollow" | "causal"; default
    `model.family`); keyword options go to the teacher (e.g. estimator="topk", k=5 for AR)."""
    return TEACHERS.lookup(family or kind_of(model).family)(model, **kwargs)


class ParametricTarget(ConditionalTarget):
    """Explicit N^1 target from a teacher: log q^i = log_softmax[log p_1(· | x_1^{≠i}) + log k_t(x_t^i | ·)]
    (MATH.md §1.3, §4). `cache_size` > 0 memoises teacher conditionals per sequence (least recently used)."""

    def __init__(self, teacher, cache_size: int = 0, cache_dtype: torch.dtype = torch.float32):
        super().__init__(self.conditionals)
        self.teacher = teacher
        self.cache_size = int(cache_size)
        self.cache_dtype = cache_dtype
        self._cache: OrderedDict[bytes, Tensor] = OrderedDict()
        self.hits = self.misses = 0

    def conditionals(self, x1: Tensor) -> Tensor:
        """Teacher log p_1(y | x_1^{≠i}) [B, L, V], from the cache where possible (MATH.md §4)."""
        if self.cache_size <= 0:
            return self.teacher(x1)
        keys = [row.tobytes() for row in x1.detach().cpu().numpy()]
        missing = [b for b, k in enumerate(keys) if k not in self._cache]
        self.hits += len(keys) - len(missing)
        self.misses += len(missing)
        fresh = {}
        if missing:
            vals = self.teacher(x1[missing])
            for j, b in enumerate(missing):
                fresh[keys[b]] = vals[j]
                self._cache[keys[b]] = vals[j].detach().to("cpu", self.cache_dtype)
        for k in keys:
            if k in self._cache:
                self._cache.move_to_end(k)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        rows = [fresh[k] if k in fresh else self._cache[k].to(x1.device, torch.float32) for k in keys]
        return torch.stack(rows)

    def prime(self, x1: Tensor, log_p1_cond: Tensor) -> None:
        """Insert precomputed teacher conditionals [N, L, V] for sequences x1 [N, L] (e.g. loaded from disk), so
        that training never runs the teacher on them (MATH.md §4: the target depends on x_1 only)."""
        if self.cache_size < x1.shape[0]:
            raise ValueError(f"cache_size={self.cache_size} cannot hold {x1.shape[0]} sequences")
        if log_p1_cond.shape != x1.shape + (self.teacher.vocab_size,):
            raise ValueError(f"expected conditionals of shape {tuple(x1.shape) + (self.teacher.vocab_size,)}")
        for row, val in zip(x1.detach().cpu().numpy(), log_p1_cond):
            self._cache[row.tobytes()] = val.detach().to("cpu", self.cache_dtype)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def __call__(self, batch, t: Tensor, path: ProbabilityPath, generator=None, *, model=None) -> TargetBatch:
        if self.teacher.vocab_size != path.vocab_size:
            raise ValueError(
                f"teacher vocabulary V={self.teacher.vocab_size} differs from the path's V={path.vocab_size}"
            )
        return super().__call__(batch, t, path, generator, model=model)

    def to(self, device) -> ParametricTarget:
        self.teacher.to(device)
        return self

    def __repr__(self) -> str:
        return f"ParametricTarget({self.teacher!r}, cache_size={self.cache_size})"
