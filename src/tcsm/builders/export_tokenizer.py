"""The run's tokenizer in an export: tokenizer.json (a character vocabulary as a `tokenizers` file, a BPE run's own
file), tokenizer_config.json naming its real special tokens and its chat template, and the special ids config.json
carries (`special_ids`). Every family whose export holds tcsm's tokenizer calls `write_tokenizer`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

__all__ = ["MASK_NAMES", "char_tokenizer_json", "special_ids", "write_tokenizer"]


def char_tokenizer_json(chars: str, mask: bool) -> dict:
    """A Hugging Face `tokenizers` file for a character vocabulary: each character is one token (a BPE model
    with no merges over the whole text), ids in the order of `chars`; [MASK] = V added when `mask`."""
    vocab = {c: i for i, c in enumerate(chars)}
    added = (
        [{"id": len(chars), "content": "[MASK]", "single_word": False, "lstrip": False, "rstrip": False,
          "normalized": False, "special": True}]
        if mask
        else []
    )  # fmt: skip
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": None, "post_processor": None, "decoder": {"type": "Fuse"},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }  # fmt: skip


#: names for the masked source's input V in an exported tokenizer, the first one the run's vocabulary lacks
MASK_NAMES = ("[MASK]", "<|mask|>", "<|tcsm_mask|>")


def _run_tokenizer_config(places) -> dict:
    """The first tokenizer_config.json of `places` (a run's, written by the trainer; an export's), else {}."""
    for where in places:
        f = where / "tokenizer_config.json" if where is not None else None
        if f is not None and f.is_file():
            try:
                value = json.loads(f.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(value, dict):
                return value
    return {}


def _chat_template(places) -> str | None:
    """The chat template an instruction run was trained with (its chat_template.jinja; an export's config)."""
    for where in places:
        if where is not None and (where / "chat_template.jinja").is_file():
            return (where / "chat_template.jinja").read_text(encoding="utf-8")
    template = _run_tokenizer_config(places).get("chat_template")
    return template if isinstance(template, str) else None


def _token_name(value) -> str | None:
    value = value.get("content") if isinstance(value, dict) else value
    return value if isinstance(value, str) else None


def _special_tokens(tokenizer_file: Path, places, mask: bool, V: int) -> tuple[dict, list[str]]:
    """(tokenizer_config entries, notes) naming the run's real special tokens: its end-of-text and padding tokens
    (as the run recorded them, else the usual names its vocabulary holds), its unknown token, and for the masked
    source a mask token that transformers adds at id V, the model's [MASK] input (a name the vocabulary lacks:
    a BERT vocabulary's own [MASK] is a clean token < V). A name the vocabulary lacks is never given for the others,
    since transformers would add it as a new token, colliding with V."""
    from tcsm.data.tokenizer_spec import EOS_CANDIDATES

    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tokenizer_file))
    except Exception:  # noqa: BLE001  (no tokenizers package, or a file it cannot read: name nothing)
        return {}, ["the tokenizer could not be read to name its special tokens"]
    vocab = tok.get_vocab(with_added_tokens=True)
    recorded = _run_tokenizer_config(places)
    out: dict = {}
    for key, candidates in (("eos_token", EOS_CANDIDATES), ("pad_token", ("<pad>", "[PAD]", "<|pad|>"))):
        name = _token_name(recorded.get(key))
        if name not in vocab:
            name = next((c for c in candidates if c in vocab), None)
        if name is not None:
            out[key] = name
    if "pad_token" not in out and "eos_token" in out:
        out["pad_token"] = out["eos_token"]  # what the run pads with (tcsm.data.tokenizer_spec)
    unk = json.loads(tok.to_str()).get("model", {}).get("unk_token")
    if isinstance(unk, str) and unk in vocab:
        out["unk_token"] = unk
    notes = []
    if mask:
        if len(vocab) == V:
            out["mask_token"] = next(n for n in MASK_NAMES if n not in vocab)
        else:
            notes.append(f"the tokenizer has {len(vocab)} tokens for V = {V}: its mask token (id {V}) is not named")
    return out, notes


def special_ids(tmp: Path) -> dict:
    """{eos_token_id, pad_token_id} of the exported tokenizer's named special tokens (for config.json)."""
    try:
        named = json.loads((tmp / "tokenizer_config.json").read_text(encoding="utf-8"))
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tmp / "tokenizer.json"))
    except Exception:  # noqa: BLE001  (no tokenizer exported, or no tokenizers package: nothing to name)
        return {}
    out = {}
    for key in ("eos", "pad"):
        name = named.get(f"{key}_token")
        i = tok.token_to_id(name) if isinstance(name, str) else None
        if i is not None:
            out[f"{key}_token_id"] = int(i)
    return out


def write_tokenizer(tmp: Path, ck, run_dir: Path | None, mask: bool) -> list[str]:
    """The run's tokenizer as tokenizer.json (a character vocabulary as a tokenizers file, a BPE run's own file —
    saved in its run directory, or the export it came from — else rebuilt from the run's data section) and
    tokenizer_config.json naming its real special tokens and the run's chat template; returns notes for the user."""
    chars = ck.data_info.get("chars")
    places = [run_dir, ck.directory]
    V = int(ck.data_info["vocab_size"])
    # transformers.AutoTokenizer reads tokenizer.json through this class; [MASK] is the masked source's input V.
    special: dict = {"tokenizer_class": "PreTrainedTokenizerFast"}
    notes: list[str] = []
    if chars:
        (tmp / "tokenizer.json").write_text(json.dumps(char_tokenizer_json(chars, mask)), encoding="utf-8")
        if mask:
            special["mask_token"] = "[MASK]"
    else:
        found = [w / "tokenizer.json" for w in places if w is not None and (w / "tokenizer.json").is_file()]
        if found:
            shutil.copyfile(found[0], tmp / "tokenizer.json")
        else:
            tok = getattr(ck.build_data(), "tokenizer", None)
            if not hasattr(tok, "save"):
                return ["the run's data has no text tokenizer (token ids are the data): no tokenizer is exported"]
            tok.save(tmp / "tokenizer.json")
        names, notes = _special_tokens(tmp / "tokenizer.json", places, mask, V)
        special.update(names)
    template = _chat_template(places)
    if template is not None:
        special["chat_template"] = template
        (tmp / "chat_template.jinja").write_text(template, encoding="utf-8")
    (tmp / "tokenizer_config.json").write_text(json.dumps(special, indent=1) + "\n", encoding="utf-8")
    return notes
