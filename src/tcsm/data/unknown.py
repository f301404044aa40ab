"""Text a tokenizer lacks. A Hugging Face tokenizer with an unknown token (WordLevel, WordPiece, some BPEs) reads
every word or character it lacks as that token — often `<unk>`, in some vocabularies the end of text — with no
error: prompts and records then say something else than was written. `unknown_spans` finds them (a character
vocabulary refuses such text itself, a byte-level BPE has none); `UnknownTally` counts them over a data file and
warns, or refuses above a share of the tokens."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from tcsm.data.base import DataError

__all__ = ["DEFAULT_MAX_UNKNOWN", "UnknownTally", "unknown_spans", "warn_unknown_prompt"]

#: the share of a data file's tokens that may be unknown before it is refused (`data.max_unknown` raises it)
DEFAULT_MAX_UNKNOWN = 0.01
_EXAMPLES = 3


def _unk_id(hf) -> int | None:
    unk = getattr(getattr(hf, "model", None), "unk_token", None)
    return hf.token_to_id(unk) if isinstance(unk, str) else None


def unknown_spans(tokenizer, text: str) -> tuple[int, list[str]]:
    """(number of tokens of `text`, the pieces of `text` the tokenizer read as its unknown token)."""
    hf = getattr(tokenizer, "hf", None)
    unk = _unk_id(hf) if hf is not None else None
    if unk is None or not text:
        return (len(tokenizer.encode(text)) if text else 0), []
    enc = hf.encode(text, add_special_tokens=False)
    return len(enc.ids), [text[a:b] for i, (a, b) in zip(enc.ids, enc.offsets) if i == unk]


def _describe(n: int, total: int, examples: list[str], unk: str) -> str:
    shown = ", ".join(repr(e) for e in examples[:_EXAMPLES])
    return f"{n} of {total} tokens ({100 * n / max(total, 1):.2f}%) are text the tokenizer lacks, read as {unk!r} (e.g. {shown})"


def _unk_name(tokenizer) -> str:
    hf = getattr(tokenizer, "hf", None)
    return str(getattr(getattr(hf, "model", None), "unk_token", "the unknown token"))


@dataclass
class UnknownTally:
    """Unknown tokens over the texts of a data file: `add` each text's, then `check` once."""

    tokens: int = 0
    unknown: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, tokenizer, text: str) -> None:
        n, spans = unknown_spans(tokenizer, text)
        self.tokens += n
        self.unknown += len(spans)
        self.examples += [s for s in spans if s not in self.examples][: _EXAMPLES - len(self.examples)]

    def check(self, tokenizer, what: str, max_share: float) -> None:
        """Nothing when no token is unknown; a one-line warning up to `max_share` of the tokens; a DataError above."""
        if not self.unknown:
            return
        line = f"{what}: {_describe(self.unknown, self.tokens, self.examples, _unk_name(tokenizer))}"
        if self.unknown > float(max_share) * self.tokens:
            raise DataError(f"{line}, more than data.max_unknown={max_share}; is this the model's tokenizer? "
                            "(raise data.max_unknown to train on it anyway)")  # fmt: skip
        warnings.warn(line, stacklevel=2)


def warn_unknown_prompt(tokenizer, text: str, what: str = "the prompt") -> None:
    """A one-line warning when `text` (a prompt) holds text the tokenizer lacks."""
    n, spans = unknown_spans(tokenizer, text)
    if spans:
        warnings.warn(f"{what}: {_describe(len(spans), n, spans, _unk_name(tokenizer))}", stacklevel=2)
