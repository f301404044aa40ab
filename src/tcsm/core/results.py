"""The typed evaluation result every evaluator returns, and the units it reports: bits per token, perplexity,
standard errors (MATH.md §2.4).
"""

from __future__ import annotations

import math
import sys

import torch
from torch import Tensor

_LN2 = math.log(2.0)


_MAX_EXP = math.log(sys.float_info.max)  # exp of anything larger overflows a float


def bits_per_token(nats, length: int):
    """BPC / bits per token = nats / (L ln 2) (MATH.md §2.4); `nats` is a per-sequence bound (float or tensor)."""
    return nats / (length * _LN2)


bpc = bits_per_token


def perplexity(nats, length: int):
    """Perplexity = exp(nats / L) (MATH.md §2.4)."""
    if isinstance(nats, Tensor):
        return torch.exp(nats / length)
    return math.exp(nats / length)


#: Words for the LMs' validation metrics: only a diffusion NELBO is a likelihood bound; the AR NLL is
#: exact and a pseudo-NLL is neither a bound nor an NLL of any joint distribution (MATH.md §4, §8 item 20).
METRIC_LABELS = {"nll": "NLL", "ar-nll": "exact NLL", "pseudo-nll": "pseudo-NLL"}


def metric_label(name: str) -> str:
    """How logs and reports name a validation metric: an LM's metric by `METRIC_LABELS`, anything else
    (a likelihood bound's name, MATH.md §2) as "<name> bound"."""
    return METRIC_LABELS.get(name, f"{name} bound")


class EvalResult(dict):
    """What every evaluator returns (the trainer, reports and `tcsm eval` format it; MATH.md §2.4): a dict — the
    row written to metrics.jsonl and the JSON reports — whose required entries are also typed attributes.

    `bound` names the quantity (a bound, MATH.md §2, or an LM's metric, `METRIC_LABELS`), `bpc` ±
    `bpc_stderr` are bits per token over `num_sequences` held-out sequences, `perplexity` is exp(nats per token).
    An evaluator may add entries (`num_t`, an estimate's pieces, preference metrics); `EvalResult.of` checks that
    the required ones are there, so a new evaluator that forgets one fails where it is called, by name."""

    REQUIRED = ("bound", "bpc", "bpc_stderr", "perplexity", "num_sequences")

    @classmethod
    def of(cls, values, where: str = "an evaluator") -> EvalResult:
        missing = [k for k in cls.REQUIRED if k not in values]
        if missing:
            raise TypeError(f"{where} returned no {missing} (an evaluation result needs {list(cls.REQUIRED)})")
        return values if isinstance(values, cls) else cls(values)

    bound = property(lambda self: str(self["bound"]), doc="the quantity's name (a bound, or an LM's metric)")
    bpc = property(lambda self: float(self["bpc"]), doc="bits per token, mean over the sequences")
    bpc_stderr = property(lambda self: float(self["bpc_stderr"]), doc="standard error of `bpc`")
    perplexity = property(lambda self: float(self["perplexity"]), doc="exp(nats per token)")
    num_sequences = property(lambda self: int(self["num_sequences"]), doc="held-out sequences evaluated")

    @property
    def label(self) -> str:
        """How logs name the quantity: "masked bound", "exact NLL", ... (`metric_label`)."""
        return metric_label(self.bound)


def summarise_nats(nats: Tensor, length: int, bound: str) -> EvalResult:
    """Dataset metrics from nats per token of each of N sequences [N]: mean and standard error (NaN for N = 1)
    as nats, bits (÷ ln 2) and perplexity exp(mean) (delta-method error), for sequences of `length` tokens,
    labelled `bound` (MATH.md §2.4). The report format of every likelihood-type metric here."""
    nats = nats.double()
    N = nats.numel()
    mean = float(nats.mean())
    se = float(nats.std(unbiased=True) / math.sqrt(N)) if N > 1 else float("nan")
    # A diverged model can exceed e^709 (the float range): its perplexity is reported as inf, not an exception.
    ppl = math.exp(mean) if mean < _MAX_EXP else math.inf
    return EvalResult(
        nats_per_token=mean,
        nats_per_token_stderr=se,
        bpc=mean / _LN2,
        bpc_stderr=se / _LN2,
        perplexity=ppl,
        perplexity_stderr=ppl * se,  # delta method
        nats_per_sequence=mean * length,
        bound=bound,
        num_sequences=N,
        num_tokens=N * length,
    )

