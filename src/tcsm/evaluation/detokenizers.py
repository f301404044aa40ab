"""Detokenisers that undo the word-level tokenisation of the classic LM test sets before GPT-2 BPE.

The zero-shot protocol of SEDD and MDLM (docs/evaluation.md) passes every line/sentence of WikiText, PTB and
LM1B, and every LAMBADA passage, through a fixed detokeniser, then GPT-2 BPE. Perplexities are only comparable
with those papers when the same string rules are applied, so the rules below reproduce that protocol exactly,
in the same order (the order matters: later rules see the output of earlier ones).
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = [
    "DETOKENIZERS",
    "lambada_detokenize",
    "lm1b_detokenize",
    "ptb_detokenize",
    "wikitext_detokenize",
]


def _apply(text: str, rules: list[tuple[str, str, bool]]) -> str:
    """Apply (pattern, replacement, is_regex) rules in order."""
    for pattern, repl, is_regex in rules:
        text = re.sub(pattern, repl, text) if is_regex else text.replace(pattern, repl)
    return text


# WikiText: "@-@"-style number separators, spaces around punctuation and inside brackets/quotes, and
# spaced-out heading markers ("= = Career = =").
_WIKITEXT_RULES: list[tuple[str, str, bool]] = [
    ("s '", "s'", False),
    (r"/' [0-9]/", r"/'[0-9]/", True),  # kept for parity with the reference protocol (it never matches)
    (" @-@ ", "-", False),
    (" @,@ ", ",", False),
    (" @.@ ", ".", False),
    (" : ", ": ", False),
    (" ; ", "; ", False),
    (" . ", ". ", False),
    (" ! ", "! ", False),
    (" ? ", "? ", False),
    (" , ", ", ", False),
    (r"\(\s*([^\)]*?)\s*\)", r"(\1)", True),
    (r"\[\s*([^\]]*?)\s*\]", r"[\1]", True),
    (r"{\s*([^}]*?)\s*}", r"{\1}", True),
    (r"\"\s*([^\"]*?)\s*\"", r'"\1"', True),
    (r"'\s*([^']*?)\s*'", r"'\1'", True),
    ("= = = =", "====", False),
    ("= = =", "===", False),
    ("= =", "==", False),
    (" \N{DEGREE SIGN} ", "\N{DEGREE SIGN}", False),
    (" \n", "\n", False),
    ("\n ", "\n", False),
    (" N ", " 1 ", False),
    (" 's", "'s", False),
]


def wikitext_detokenize(text: str) -> str:
    """WikiText (raw) line → natural text, as in the SEDD/MDLM zero-shot protocol."""
    return _apply(text, _WIKITEXT_RULES)


def ptb_detokenize(text: str) -> str:
    """PTB (Mikolov) sentence → natural text: re-attach clitics, numbers ("N" → "1"), "<unk>" → "?"."""
    text = _apply(text, [(" 's", "'s", False), ("s ' ", "s' ", False), (" n't", "n't", False),
                         (" \n ", "\n", False), ("\\/", "/", False)])
    # Runs of "N N N" overlap, so one pass of str.replace leaves every second one; the protocol repeats it.
    for _ in range(10):
        text = text.replace(" N ", " 1 ")
    return _apply(text, [("$ 1", "$1", False), ("# 1", "#1", False), ("<unk>", "?", False)])


_LM1B_RULES: list[tuple[str, str, bool]] = [
    ("http : / / ", "http://", False),
    ("https : / / ", "https://", False),
    (r" '(\w+)", r"'\1", True),
    (r" (\w+) \. ", r" \1. ", True),
    (r" (\w+) \.$", r" \1.", True),
    (" ? ", "? ", False),
    (r" \?$", "?", True),
    (" ! ", "! ", False),
    (r" \!$", "!", True),
    (" , ", ", ", False),
    (" : ", ": ", False),
    (" ; ", "; ", False),
    (" / ", "/", False),
    (r"\" ([^\"]+) \"", r'"\1"', True),
    (r"' ([^']+) '", r"'\1'", True),
    (r"\( ([^\(\)]+) \)", r"(\1)", True),
    (r"\[ ([^\[\]]+) \]", r"[\1]", True),
    ("$ ", "$", False),
    ("\N{POUND SIGN} ", "\N{POUND SIGN}", False),
]


def lm1b_detokenize(text: str) -> str:
    """One Billion Words sentence → natural text (re-attach punctuation, quotes, brackets, URLs)."""
    return _apply(text, _LM1B_RULES)


def lambada_detokenize(text: str) -> str:
    """LAMBADA passage → straight quotes, stripped, and prefixed by a newline (the protocol's passage separator)."""
    text = text.replace("\N{LEFT DOUBLE QUOTATION MARK}", '"').replace("\N{RIGHT DOUBLE QUOTATION MARK}", '"')
    return "\n" + text.strip()


DETOKENIZERS: dict[str, Callable[[str], str]] = {
    "wikitext": wikitext_detokenize,
    "ptb": ptb_detokenize,
    "lm1b": lm1b_detokenize,
    "lambada": lambada_detokenize,
}
