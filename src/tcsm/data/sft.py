"""Instruction data (the `sft` data kind): JSON lines of prompts and completions, in TRL's dataset formats.

Record formats (`prompt_field` / `completion_field` / `messages_field` rename the keys):

* prompt / completion texts: `{"prompt": "...", "completion": "..."}`;
* conversational prompt / completion: `{"prompt": [messages], "completion": [messages]}`;
* conversation: `{"messages": [{"role": ..., "content": ...}, ...]}`, whose last message is the assistant's answer
  (the completion) and the ones before it the prompt.

Messages are rendered to text with a chat template (`chat_template`: the Jinja text, a `.jinja` file, or a Hugging
Face tokenizer directory whose tokenizer_config.json holds one): the prompt with `add_generation_prompt=True`,
the completion as what rendering the whole conversation adds to it. A record whose roles the template does not
name (e.g. ShareGPT's "human" / "gpt" against a user / assistant template) is not used.

The conventions are the preference pairs' (`tcsm.data.pairs`): the run's tokenizer (`tokenizer`:
the pre-trained run's data section), one row of `seq_len` tokens per record, `encode(prompt) + encode(completion)`
padded after the completion with the end-of-text token (or `pad`) — the padding is part of the response the model
learns to produce, so it learns to stop — and the prompt positions are conditioning (`Batch.cond_mask`): never
noised, never scored, so the loss is on completion tokens only. Bad records are counted by reason; too-long
records are refused unless `truncate`; a file with no usable record is a one-line DataError.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import torch
from torch import Tensor

from tcsm.core.batch import Batch
from tcsm.data.base import DataError, RowsBundle, TensorRows, jsonl_objects
from tcsm.data.build import DATA_KINDS
from tcsm.data.prompted import build_prompted, encode, fit_prompt_rows, prompted_source
from tcsm.data.unknown import DEFAULT_MAX_UNKNOWN

__all__ = ["ChatTemplate", "SFTBundle", "SFTRows", "build_sft", "read_sft_records"]


@dataclass(frozen=True)
class SFTRows(TensorRows):
    """Tokenised records of one split: ids [N, L] and the prompt mask [N, L]."""

    x1: Tensor
    prompt_mask: Tensor

    def to_batch(self, device=None) -> Batch:
        return Batch(x1=self.x1.to(device=device, dtype=torch.long), cond_mask=self.prompt_mask.to(device=device))


@dataclass
class SFTBundle(RowsBundle):
    """Train / valid / test `SFTRows` and their tokenizer: batches hold the prompt as `cond_mask`."""

    train: SFTRows
    valid: SFTRows
    test: SFTRows

    def summary(self) -> str:
        return self.describe_rows("prompt/completion records")


# --------------------------------------------------------------------------------------------------- chat


class ChatTemplate:
    """A Hugging Face chat template (Jinja) rendered the way transformers renders it, without transformers."""

    def __init__(self, source: str):
        self.text = _template_text(source)
        try:
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:  # pragma: no cover - jinja2 comes with torch
            raise DataError("chat templates need the `jinja2` package: pip install jinja2") from None
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(message):
            raise DataError(f"chat template: {message}")

        env.globals["raise_exception"] = raise_exception
        try:
            self.template = env.from_string(self.text)
        except Exception as e:  # noqa: BLE001  (jinja2's TemplateSyntaxError and friends)
            raise DataError(f"chat template does not parse: {e}") from None

    def knows(self, role: str) -> bool:
        """Whether the template renders a message of `role`: its content appears when the template is rendered on a
        test conversation holding it (alone, or after a user turn, for templates that insist on the user first).
        Reading the template's text would miss roles it renders through `{% else %}` or by name
        (`'<|im_start|>' + message['role']`)."""
        known = self.__dict__.setdefault("_known", {})
        if role not in known:
            probe = "\u27e6tcsm-role-probe\u27e7"
            message = {"role": role, "content": probe}
            contexts = ([message], [{"role": "user", "content": "q"}, message],
                        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, message])
            shown = [self._shows(c, probe) for c in contexts]
            # a template that fails on every conversation holding the role is broken, not silent about it: the
            # record's own rendering then says how it fails
            known[role] = any(shown) or all(s is None for s in shown)
        return known[role]

    def _shows(self, messages: list[dict], probe: str) -> bool | None:
        """Whether the probe appears; None when the template fails on this conversation (an order of roles it does
        not take, or a fault of its own)."""
        try:
            return probe in self.render(messages, add_generation_prompt=False)
        except DataError:
            return None

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        """The template's text for `messages`; DataError (one line) when the template fails while rendering (an
        undefined name or attribute, a filter on the wrong type, its own raise_exception)."""
        try:
            return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt, bos_token="",
                                        eos_token="")  # fmt: skip
        except DataError:
            raise
        except Exception as e:  # noqa: BLE001  (jinja2's UndefinedError, SecurityError, and the template's own errors)
            text = " ".join(str(e).split()) or "no message"
            raise DataError(f"chat template fails while rendering: {type(e).__name__}: {text}") from None


def _template_text(source: str) -> str:
    if "{%" in source or "{{" in source:
        return source
    p = Path(source).expanduser()
    if p.is_dir():
        for name in ("chat_template.jinja", "tokenizer_config.json"):
            f = p / name
            if f.is_file():
                if name.endswith(".jinja"):
                    return f.read_text(encoding="utf-8")
                import json

                text = json.loads(f.read_text(encoding="utf-8")).get("chat_template")
                if isinstance(text, str):
                    return text
        raise DataError(f"{p} holds no chat template (chat_template.jinja or tokenizer_config.json's chat_template)")
    if p.is_file():
        return p.read_text(encoding="utf-8")
    raise DataError(f"data.chat_template must be Jinja text, a .jinja file or a tokenizer directory, got {source!r}")


def _messages(value) -> list[dict] | None:
    ok = isinstance(value, list) and value and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value
    )
    return value if ok else None


# --------------------------------------------------------------------------------------------------- reading


def read_sft_records(path, fields: tuple[str, str, str], template: ChatTemplate | None, bad: Counter):
    """(line number, prompt text, completion text) of every usable record; the others are counted in `bad`."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise DataError(f"instruction data {str(p)!r} is a directory; give the JSONL file of records")
    if not p.is_file():
        raise DataError(f"instruction data file not found: {p}")
    prompt_key, completion_key, messages_key = fields
    records = []
    for n, obj in jsonl_objects(p):
        if obj is jsonl_objects.BAD or not isinstance(obj, dict):
            bad["unreadable JSON or not an object"] += 1
            continue
        if messages_key in obj:
            msgs = _messages(obj[messages_key])
            if msgs is None:
                bad[f"{messages_key!r} is not a list of role/content messages"] += 1
                continue
            prompt, completion = msgs[:-1], msgs[-1:]
        elif prompt_key in obj and completion_key in obj:
            prompt, completion = obj[prompt_key], obj[completion_key]
            if isinstance(prompt, str) and isinstance(completion, str):
                if not completion.strip():
                    bad["empty completion"] += 1
                else:
                    records.append((n, prompt, completion))
                continue
            prompt, completion = _messages(prompt), _messages(completion)
            if prompt is None or completion is None:
                bad["prompt / completion neither texts nor messages"] += 1
                continue
        else:
            bad["missing field"] += 1
            continue
        if template is None:
            raise DataError(
                f"{p}:{n} is a chat record (role/content messages) but no chat template is set; give data.chat_template "
                "(Jinja text, a .jinja file or a tokenizer directory with one), or write prompt/completion texts"
            )
        unknown = sorted({m["role"] for m in prompt + completion if not template.knows(m["role"])})
        if unknown:
            bad[f"roles the chat template does not name ({', '.join(unknown)})"] += 1
            continue
        if not prompt or completion[-1]["role"] != "assistant":
            bad["conversation does not end with an assistant answer after a prompt"] += 1
            continue
        try:
            head = template.render(prompt, add_generation_prompt=True)
            whole = template.render(prompt + completion, add_generation_prompt=False)
        except DataError as e:  # the template, not this record, is at fault: say where it failed
            raise DataError(f"{p}:{n}: {e}; fix data.chat_template (--chat-template)") from None
        if not whole.startswith(head) or not whole[len(head):].strip():
            bad["chat template does not extend the prompt with the answer"] += 1
            continue
        records.append((n, head, whole[len(head):]))
    return records


def tokenize_sft(records, tokenizer, seq_len: int, *, truncate: bool, pad_id: int | None, bad: Counter, where: str):
    """(SFTRows, number truncated): `encode(prompt) + encode(completion)` padded with `pad_id` to `seq_len`."""
    rows = [(n, [encode(tokenizer, prompt), encode(tokenizer, completion)]) for n, prompt, completion in records]
    (x1,), mask, truncated = fit_prompt_rows(
        rows, seq_len, pad_id, int(getattr(tokenizer, "vocab_size", 0)), slots=1, truncate=truncate, bad=bad,
        where=where, record="record", part="completion",
    )
    return SFTRows(x1, mask), truncated


def build_sft(
    path: str | None = None,
    train_path: str | None = None,
    valid_path: str | None = None,
    test_path: str | None = None,
    tokenizer: dict | None = None,
    seq_len: int | None = None,
    truncate: Annotated[bool, "cut completions that do not fit the model's length (default: refuse such records)"] = False,
    pad: str | None = None,
    prompt_field: str = "prompt",
    completion_field: str = "completion",
    messages_field: str = "messages",
    chat_template: Annotated[
        str | None, "chat template for messages records: Jinja text, .jinja file or tokenizer dir"
    ] = None,
    max_unknown: Annotated[float, "share of the records' tokens that may be text the tokenizer lacks (read as its "
                           "unknown token; warned, refused above)"] = DEFAULT_MAX_UNKNOWN,
    valid_frac: float = 0.1,
    test_frac: float = 0.0,
    seed: int = 0,
    name: str | None = None,
) -> SFTBundle:
    """The `sft` data kind (see the module docstring)."""
    source = prompted_source(
        "sft", tokenizer, for_what="the run it fine-tunes", command="tcsm finetune sft --from RUN", path=path,
        train_path=train_path, valid_path=valid_path, test_path=test_path, seq_len=seq_len, pad=pad,
        valid_frac=valid_frac, test_frac=test_frac, max_unknown=max_unknown,
    )  # fmt: skip
    template = ChatTemplate(chat_template) if chat_template else None
    fields = (prompt_field, completion_field, messages_field)
    opts = {"truncate": bool(truncate), "pad_id": source.pad_id, "bad": source.bad}

    def tokenize(f):
        records = [] if f is None else read_sft_records(f, fields, template, source.bad)
        return tokenize_sft(records, source.tokenizer, source.seq_len, where=f or "", **opts)

    # the template is saved with the run (chat_template.jinja) and its export (tokenizer_config.json), so the model
    # is prompted at inference as it was trained
    return build_prompted(
        source, SFTBundle, tokenize, valid_frac=valid_frac, test_frac=test_frac, seed=seed, name=name,
        empty="no usable prompt/completion record in {src} ({reasons}); each JSON line needs "
        f"{prompt_field!r} and {completion_field!r} texts (or messages), or {messages_field!r}",
        meta={"chat_template": template.text} if template is not None else {},
    )  # fmt: skip


DATA_KINDS["sft"] = build_sft
