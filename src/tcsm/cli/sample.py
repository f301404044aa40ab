"""`tcsm sample`: draw sequences from a trained checkpoint, unconditionally, after prompts, or by infilling.

Conditioning (MATH.md §6; `tcsm.sampling.sample` pins the given tokens from t = 0 on):

* `--prompt TEXT` (repeatable): the prompt's tokens are fixed at the start of every sample; `--num-samples`
  continuations are drawn per prompt.
* `--infill TEMPLATE` (repeatable): every `--placeholder` character (default "_") is one position to fill and
  the text between placeholders is kept; positions after the template are filled too. For a character model
  one character is one position; for a BPE model the kept text is encoded piece by piece.
* `--infill-json FILE`: JSON lines (or one JSON list) of token-id lists with null for the positions to fill,
  e.g. `[464, null, null, 3332]`, or objects {"tokens": [...]}.

A block model (trained with path.block_length) is decoded block by block with its KV cache, `--method` inside each
block and `--steps` per block. `--max-new-tokens N` returns exactly N tokens after each prompt (a block model draws
its last block whole and the sample is cut), as long as the model's positions allow. A sample ends at its first
generated end-of-sequence token (`--eos`; by default the run's sample.eos_id, else the data's end-of-sequence
token in a task or SFT run, else a block model's tokenizer's EOS): its text ends there.

Output: `--format text` (one sample per line, newlines inside a sample written as "\\n") or `jsonl` (one JSON
object per sample with its text, tokens and conditioning), to `--output` or stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import types
from dataclasses import dataclass, field

HELP = "draw samples from a trained checkpoint (prompts, infilling, temperature, top-p)"


def _one_line_error(self, message: str):
    # Bad values (non-numbers, unknown choices) get the same one-line form as every other user error.
    self.exit(2, f"tcsm sample: error: {message}\n")


def _positive(name: str, value) -> tuple[bool, str]:
    return value is None or int(value) >= 1, f"--{name.replace('_', '-')} must be a positive integer, got {value}"


@dataclass(frozen=True)
class SampleCommand:
    """The command's own options (what to draw and where), besides the run's `sample:` section: a flag each."""

    num_samples: int = field(default=4, metadata={"help": "samples (per prompt / template when given); default 4"})
    seed: int = field(default=0, metadata={"help": "seed of every random draw (default 0)"})
    length: int | None = field(default=None, metadata={"help": "sequence length (default: the training length)"})
    max_new_tokens: int | None = field(default=None, metadata={
        "help": "exactly N new tokens after each prompt (without one: N tokens; a block model draws its last block "
                "whole and cuts it), up to the model's positions (instead of --length)"})  # fmt: skip
    batch_size: int = field(default=16, metadata={"help": "sequences per sampler call (memory)"})
    device: str = field(default="auto", metadata={"help": "auto | cpu | cuda | cuda:N"})
    ema: bool = field(default=True, metadata={"help": "the EMA weights (else the raw ones) when the run kept them"})
    progress: bool = field(default=True, metadata={"help": "the progress bar"})

    def __post_init__(self):
        for name in ("num_samples", "length", "max_new_tokens", "batch_size"):
            ok, msg = _positive(name, getattr(self, name))
            if not ok:
                raise ValueError(msg)


def _sampler_help() -> str:
    from tcsm.sampling.registry import sampler_class, sampler_names

    names = sampler_names()
    orders = ", ".join(n for n in names if sampler_class(n).steps_at_most_positions)
    return (f"sampler: {' | '.join(names)} (default: the run's sample.method, else ancestral for masked, analytic for "
            f"uniform; {orders} are decoding orders for masked models)")  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    from tcsm.cli.fields import add_field_flags
    from tcsm.sampling.registry import sampler_names
    from tcsm.sampling.settings import SampleSettings

    p.error = types.MethodType(_one_line_error, p)
    p.epilog = __doc__.split("\n\n", 1)[1] + ("\nExample: tcsm sample runs/my-run -n 8 --steps 256 --prompt 'the cat' "
                                               "-o s.jsonl sample.temperature=0.9")  # fmt: skip
    p.add_argument("checkpoint", help="run directory, checkpoints directory or step_* directory")
    p.add_argument("overrides", nargs="*", metavar="sample.key=value",
                   help="settings of the run's sample: section, e.g. sample.temperature=0.9 (as the flags below)")
    p.add_argument("--print-config", action="store_true", help="print the sample: section this draw uses and exit")
    p.add_argument("--prompt", action="append", default=[], metavar="TEXT", help="prefix prompt (repeatable)")
    p.add_argument("--infill", action="append", default=[], metavar="TEMPLATE",
                   help="infilling template; placeholder characters mark the positions to fill (repeatable)")
    p.add_argument("--infill-json", default=None, metavar="FILE",
                   help="JSON lines of token-id lists, null = position to fill")
    p.add_argument("--placeholder", default="_", help="placeholder character of --infill (default '_')")
    p.add_argument("--format", choices=("text", "jsonl"), default=None,
                   help="output format (default: jsonl if --output ends in .jsonl, else text)")
    p.add_argument("-o", "--output", default=None,
                   help="output file (default: stdout); a file tcsm did not write is kept unless --overwrite")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output file whatever wrote it")
    add_field_flags(p, SampleCommand, dest="command", aliases={"num_samples": ("-n",)})
    group = p.add_argument_group("sampler settings (the run's sample: section; default: the run's own values)")
    add_field_flags(group, SampleSettings, dest="sample", aliases={"eos_id": ("--eos",)},
                    choices={"method": sampler_names()})
    group._group_actions[0].help = _sampler_help()


# --------------------------------------------------------------------------------------------------- conditioning


def template_positions(template: str, encode, placeholder: str, length: int) -> tuple[list[bool], list[int]]:
    """(fixed, values) of length `length` from an infilling template: placeholder characters are free
    positions, the text between them is encoded and kept, positions after the template are free."""
    if len(placeholder) != 1:
        raise ValueError(f"--placeholder must be one character, got {placeholder!r}")
    fixed: list[bool] = []
    values: list[int] = []
    piece = ""
    for ch in template + "\0":
        if ch == placeholder or ch == "\0":
            if piece:
                ids = list(encode(piece))
                fixed += [True] * len(ids)
                values += ids
                piece = ""
            if ch == placeholder:
                fixed.append(False)
                values.append(0)
        else:
            piece += ch
    if len(fixed) > length:
        raise ValueError(f"infilling template is {len(fixed)} tokens long but samples have length {length}")
    pad = length - len(fixed)
    return fixed + [False] * pad, values + [0] * pad


def _read_infill_json(path: str, length: int, vocab_size: int) -> list[tuple[list[bool], list[int], list]]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise OSError(e.errno, e.strerror, path) from None
    try:
        stripped = text.strip()
        rows = json.loads(stripped) if stripped.startswith("[[") else [
            json.loads(line) for line in text.splitlines() if line.strip()
        ]
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON lines of token lists ({e.msg} at line {e.lineno})") from None
    out = []
    for i, row in enumerate(rows):
        toks = row.get("tokens") if isinstance(row, dict) else row
        if not isinstance(toks, list) or not all(t is None or (isinstance(t, int) and not isinstance(t, bool))
                                                 for t in toks):
            raise ValueError(f"{path}: template {i} must be a list of token ids and nulls")
        if len(toks) > length:
            raise ValueError(f"{path}: template {i} has {len(toks)} positions but samples have length {length}")
        bad = [t for t in toks if t is not None and not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"{path}: template {i} has token id {bad[0]} outside the vocabulary [0, {vocab_size})")
        pad = length - len(toks)
        out.append(([t is not None for t in toks] + [False] * pad, [t or 0 for t in toks] + [0] * pad, toks))
    if not out:
        raise ValueError(f"{path}: no templates")
    return out


def generation_length(prompt_len: int, max_new_tokens: int, block: int | None) -> int:
    """The length drawn for `max_new_tokens` after a prompt: their sum, rounded up to whole blocks of `block` (the
    last block is drawn whole; the sample is then cut to the sum)."""
    n = int(prompt_len) + int(max_new_tokens)
    return -(-n // block) * block if block else n


def first_generated(row: list[int], fixed: list[bool] | None, eos_id: int | None) -> int | None:
    """The position of the first `eos_id` the sampler generated in `row` (pinned positions do not count), or None."""
    if eos_id is None:
        return None
    return next((i for i, t in enumerate(row) if t == eos_id and not (fixed and fixed[i])), None)


# --------------------------------------------------------------------------------------------------- tokenizer


def load_tokenizer(loaded):
    """The tokenizer of the checkpoint's training data, from the run itself when it can be: a character
    vocabulary is stored in every checkpoint (data_info), a BPE tokenizer in the run's `tokenizer.json`. Older runs
    fall back to GPT-2's two files, or to rebuilding the data bundle (deterministic: the same tokenizer)."""
    from omegaconf import OmegaConf

    from tcsm.cli.common import run_dir_of_checkpoint
    from tcsm.data import CharTokenizer

    chars = loaded.data_info.get("chars")
    if chars:
        return CharTokenizer(chars)
    saved = run_dir_of_checkpoint(loaded.directory) / "tokenizer.json"
    if saved.is_file():
        from tcsm.data import BPETokenizer
        from tcsm.data.bpe import _tokenizers

        return BPETokenizer(_tokenizers().Tokenizer.from_file(str(saved)), "saved")
    data = OmegaConf.to_container(loaded.config.data, resolve=True)
    if data.get("kind") == "bpe" and data.get("tokenizer", "gpt2") == "gpt2":
        from tcsm.data import gpt2_tokenizer

        return gpt2_tokenizer(data.get("bpe_dir"), data.get("encoder_json"), data.get("vocab_bpe"))
    return loaded.build_data().tokenizer


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


# --------------------------------------------------------------------------------------------------- run


def _sample_keys(args) -> dict:
    """{key: value} of the run's `sample:` section that this command line sets: the sampler flags, then the
    `sample.key=value` overrides (parsed as every config override is)."""
    from omegaconf import OmegaConf

    from tcsm.cli.fields import given
    from tcsm.core.errors import ConfigError
    from tcsm.sampling.settings import SampleSettings
    from tcsm.storage.migration import current_key

    values = given(args, "sample")
    known = [f.name for f in dataclasses.fields(SampleSettings)]
    for item in args.overrides:
        key, eq, rest = item.partition("=")
        if current_key(key, rest, {}) != key:  # an old name of a sampler setting reads as the new one
            print(f"tcsm: note: {key} is now {current_key(key, rest, {})}", file=sys.stderr)
            key = current_key(key, rest, {})
            item = f"{key}{eq}{rest}"
        section, _, leaf = key.partition(".")
        if not eq or section != "sample" or "." in leaf:
            raise ConfigError(f"tcsm sample takes overrides of the sample: section (sample.key=value), got {item!r}")
        if leaf not in known:
            raise ConfigError(f"{key} is not a sampler setting; the sample: section's are {', '.join(known)}")
        try:
            values[leaf] = OmegaConf.to_container(OmegaConf.from_dotlist([item]))["sample"][leaf]
        except Exception as e:  # noqa: BLE001  (OmegaConf's grammar errors: one line)
            raise ConfigError(f"cannot read the override {item!r}: {str(e).splitlines()[0]}") from None
    return values


def _chosen_sampler(kind, method: str | None):
    """The registered sampler class that draws from a model of `kind`: the one its objective brings, else `method`'s
    (`sampling.settings.DEFAULT_METHOD` when None), or `method`'s when it replaces the objective's (speculative
    decoding)."""
    from tcsm.sampling.registry import own_sampler_class, sampler_class
    from tcsm.sampling.settings import DEFAULT_METHOD

    cls = sampler_class(method or DEFAULT_METHOD)
    if kind.own_sampler and not cls.replaces_own:  # speculative decoding verifies an AR model itself
        return own_sampler_class(kind.own_sampler)
    return cls


def _check_keys_read(given: dict, cls, kind) -> None:
    """Every key the command line sets is one the chosen sampler (or block decoding) reads: a setting no sampler of
    this run reads would be silently ignored."""
    from tcsm.cli.fields import flag_name
    from tcsm.sampling.blocks import BlockDecodeSettings
    from tcsm.sampling.registry import all_sampler_classes
    from tcsm.sampling.settings import SampleSettings

    reads = {f.name for f in dataclasses.fields(cls.settings_type)} | {"eos_id"}  # every sample's text ends at EOS
    if not cls.own:
        reads |= {"method"} | {f.name for f in dataclasses.fields(BlockDecodeSettings)}
    schema = {f.name: f for f in dataclasses.fields(SampleSettings)}
    for key in given:
        if key in reads:
            continue
        owners = [c for c in all_sampler_classes() if key in {f.name for f in dataclasses.fields(c.settings_type)}]
        path_owners = [c.name for c in owners if not c.own]
        where = [f"the {c.name} sampler ({c.help})" for c in owners if c.own]
        where += [f"--method {' | '.join(path_owners)}"] if path_owners else []
        raise ValueError(
            f"{flag_name(schema[key])} (sample.{key}) is not a setting of the {cls.name} sampler, which draws from "
            f"{kind.description} here" + (f"; it is a setting of {', '.join(where)}" if where else "")
            + f"; this sampler reads {', '.join(sorted(reads))}"
        )


def _objective_of(loaded, model, device, cls):
    """The run's objective when the sampler is one an objective brings (SIR, left to right); None otherwise. A run
    whose objective cannot be rebuilt here (its reference run is gone) is drawn by `sample.method`'s sampler."""
    if not cls.own:
        return None
    from tcsm.builders.assemble import build_objective_for_checkpoint
    from tcsm.builders.components import DataInfo
    from tcsm.core.errors import TCSMError

    try:
        return build_objective_for_checkpoint(loaded.config, model, DataInfo(**loaded.data_info), device)
    except TCSMError:
        return None


def run(args) -> int:
    import torch

    from tcsm.builders.config import to_dict
    from tcsm.builders.loading import load_checkpoint
    from tcsm.cli.common import check_writable
    from tcsm.cli.fields import given as given_flags
    from tcsm.core.errors import ConfigError
    from tcsm.core.progress import WorkProgress
    from tcsm.data.base import readable_text
    from tcsm.models.kinds import kind_of
    from tcsm.sampling.common import row_evaluations
    from tcsm.sampling.settings import RunSampler, sample_settings
    from tcsm.storage.fileio import write_atomically
    from tcsm.train.distributed import resolve_device

    try:
        cmd = SampleCommand(**given_flags(args, "command"))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    given = _sample_keys(args)
    conditioned = bool(args.prompt) + bool(args.infill) + bool(args.infill_json)
    if conditioned > 1:
        raise ValueError("give prompts, infilling templates or --infill-json, not several kinds at once")
    fmt = args.format or ("jsonl" if (args.output or "").endswith(".jsonl") else "text")
    if args.output and not args.print_config:  # before any work: a bad path must not cost a sampling run
        check_writable(args.output, overwrite=args.overwrite)

    device = resolve_device(cmd.device)
    loaded = load_checkpoint(args.checkpoint, device=device, ema=cmd.ema)
    model, path = loaded.model, loaded.build_path()
    kind = kind_of(model)
    if not kind.draws_sequences:
        family = str(loaded.config.model.get("name", kind.family))
        raise ValueError(f"{loaded.directory} holds a {family} LM: its single-site conditionals "
                         "p(x^i | x^≠i) give no sampler of whole sequences (it is a teacher for target.name=parametric)")
    section = {**to_dict(loaded.config.sample), **given}
    sample_settings(section)  # every sampler validates its own keys, before the model's checks
    cls = _chosen_sampler(kind, section.get("method"))
    _check_keys_read(given, cls, kind)
    if cls.prompts_only and (args.infill or args.infill_json):
        raise ValueError(f"{kind.description} is sampled left to right: it can continue a --prompt, not fill a "
                         "template (--infill / --infill-json need a diffusion run)")  # fmt: skip
    block = int(model.block_length) if kind.blocks else None  # decoded block by block with its KV cache
    if block and given.get("semi_ar_block") is not None:
        raise ValueError(f"--semi-ar-block decodes a full-sequence model in uncached blocks; {loaded.directory} holds a "
                         f"block model, decoded by its own blocks of {block} with its KV cache: leave it out")
    if cmd.max_new_tokens is not None and (cmd.length is not None or args.infill or args.infill_json):
        raise ValueError("--max-new-tokens sets the length after a prompt: give it without --length, --infill or "
                         "--infill-json")
    V = path.vocab_size
    length = cmd.length or int(loaded.data_info["seq_len"])
    max_len = getattr(getattr(model, "cfg", None), "max_len", None)
    if max_len is not None and length > max_len:
        raise ValueError(f"--length {length} exceeds the model's maximum length {max_len}")
    tok = load_tokenizer(loaded)
    if block and "eos_id" not in given and section.get("eos_id") is None:  # stop at the tokenizer's end of text
        section["eos_id"] = getattr(tok, "eos_id", None)
    # where a sample's text ends: the same, else the data's end of sequence (task, SFT runs); only block decoding
    # stops there, so a full-sequence model's sampler does not get it
    eos_id = section.get("eos_id") if block else section.pop("eos_id", None)
    if eos_id is None and "eos_id" not in given:
        eos_id = loaded.data_eos_id()
    if eos_id is not None and not 0 <= eos_id < V:
        raise ValueError(f"--eos {eos_id} is not a token id of the {V}-token vocabulary")
    settings = sample_settings(section)
    if args.print_config:
        from omegaconf import OmegaConf

        print(OmegaConf.to_yaml({"sample": to_dict(OmegaConf.create(dataclasses.asdict(settings)))}), end="")
        return 0

    def length_after(prompt_len: int) -> int:
        """The length drawn for a prompt of `prompt_len` tokens: `length`, or the prompt and --max-new-tokens
        rounded up to whole blocks."""
        if cmd.max_new_tokens is None:
            return length
        n = generation_length(prompt_len, cmd.max_new_tokens, block)
        if max_len is not None and n > max_len:
            raise ValueError(f"--max-new-tokens {cmd.max_new_tokens} after {prompt_len} prompt tokens needs length {n}, "
                             f"beyond the model's maximum length {max_len}")  # fmt: skip
        return n

    # One group per prompt / template; every group gets num_samples samples.
    groups: list[dict] = []
    if args.prompt:
        from tcsm.data.unknown import warn_unknown_prompt

        for text in args.prompt:
            ids = list(tok.encode(text))
            warn_unknown_prompt(tok, text, f"prompt {text[:30]!r}")
            n = length_after(len(ids))
            if len(ids) > n:
                raise ValueError(f"prompt {text[:30]!r} is {len(ids)} tokens long but samples have length {n}")
            fixed = [True] * len(ids) + [False] * (n - len(ids))
            groups.append({"fixed": fixed, "values": ids + [0] * (n - len(ids)), "info": {"prompt": text},
                           "keep": None if cmd.max_new_tokens is None else len(ids) + cmd.max_new_tokens})
    elif args.infill:
        for text in args.infill:
            fixed, values = template_positions(text, tok.encode, args.placeholder, length)
            groups.append({"fixed": fixed, "values": values, "info": {"template": text}})
    elif args.infill_json:
        for fixed, values, toks in _read_infill_json(args.infill_json, length, V):
            groups.append({"fixed": fixed, "values": values, "info": {"template_tokens": toks}})
    else:
        groups.append({"fixed": None, "values": None, "info": {}, "length": length_after(0), "keep": cmd.max_new_tokens})
    for g in groups:
        g["length"] = g.get("length") or len(g["fixed"])
        if g["values"] is not None and any(v >= V for v in g["values"]):
            raise ValueError(f"the tokenizer produced ids outside the model's {V}-token vocabulary")

    sampler = RunSampler(model, path, _objective_of(loaded, model, device, cls), settings)
    if getattr(settings, "drafter", None) and "drafter" in {f.name for f in dataclasses.fields(cls.settings_type)}:
        from tcsm.builders.loading import load_drafter

        sampler.drafter_model = load_drafter(settings.drafter, device, path.vocab_size, loaded, settings)
    generator = torch.Generator(device=device).manual_seed(int(cmd.seed))
    chunks = [(g, min(cmd.batch_size, cmd.num_samples - s)) for g in groups
              for s in range(0, cmd.num_samples, cmd.batch_size)]
    per_position = (sampler.own and "steps" not in {f.name for f in dataclasses.fields(cls.settings_type)}) or bool(
        kind.own_sampler and cls.replaces_own)  # an AR model's speculative decoding: positions, not path steps
    steps = length if per_position else settings.steps  # a left-to-right draw takes one position per step
    # steps per chunk: one per position, a block model `steps` per block
    per_chunk = [g["length"] if per_position else g["length"] // block * steps if block else steps for g, _ in chunks]
    bar = WorkProgress(sum(per_chunk), "sampling", "steps", enabled=cmd.progress)
    t0 = time.perf_counter()
    records, calls, evals, taken = [], 0, 0, 0
    spec = {"passes": 0, "drafted": 0, "accepted": 0}  # speculative decoding's counts
    for g, b in chunks:
        kw = {}
        if g["fixed"] is not None:
            kw["fixed"] = torch.tensor(g["fixed"], dtype=torch.bool, device=device).expand(b, -1)
            kw["values"] = torch.tensor(g["values"], dtype=torch.long, device=device).expand(b, -1)
        with torch.no_grad():
            tokens, stats = sampler(b, g["length"], generator=generator, device=device,
                                    callback=lambda k, t, x: bar.update(1) if k > 0 else None, **kw)
        if sampler.own:
            bar.update(steps)
        calls += stats.num_calls
        evals += row_evaluations(stats, b)
        for key, name in (("passes", "sequence_passes"), ("drafted", "drafted"), ("accepted", "accepted")):
            spec[key] += int(getattr(stats, "counts", {}).get(name, 0))
        taken = max(taken, getattr(stats, "num_steps", 0))
        for row in tokens.cpu().tolist():
            row = row[: g.get("keep") or len(row)]  # exactly --max-new-tokens: the last block was drawn whole
            end = first_generated(row, g["fixed"], eos_id)
            text, row = (row, row) if end is None else (row[:end], row[: end + 1])  # the text ends before the EOS
            records.append({"index": len(records), **g["info"], "text": readable_text(tok, text), "tokens": row,
                            "length": g.get("keep") or g["length"]})  # fmt: skip
    bar.close()
    elapsed = time.perf_counter() - t0
    if not cls.fixed_steps and not sampler.own:  # its steps follow from its settings: the most taken
        steps = taken

    meta = {"checkpoint": str(loaded.directory), "step": loaded.step, "weights": loaded.weights,
            "method": stats.method, "steps": steps, "grid": settings.grid, "temperature": settings.temperature,
            "top_p": settings.top_p, "seed": cmd.seed}
    if block:
        meta.update(block_length=block)
    if eos_id is not None or block:
        meta.update(eos_id=eos_id)
    lines = [json.dumps({**r, **meta}, ensure_ascii=False) if fmt == "jsonl" else _escape(r["text"]) for r in records]
    if args.output:
        write_atomically(args.output, "".join(line + "\n" for line in lines))
    else:
        sys.stdout.write("".join(line + "\n" for line in lines))
    sizes = sorted({g.get("keep") or g["length"] for g in groups})
    sizes = f"length {sizes[0]}" if len(sizes) == 1 else f"lengths {sizes[0]}-{sizes[-1]}"
    print(
        f"tcsm sample: {len(records)} samples of {sizes} from {loaded.directory} (step {loaded.step}, "
        f"{loaded.weights} weights), {stats.method} sampler, {steps} steps{f' per block of {block}' if block else ''}, "
        f"{calls} network calls "
        f"(batched; {evals / max(len(records), 1):.1f} per sequence), "
        + (f"{spec['passes'] / max(len(records), 1):.1f} sequential model passes per sequence, "
           f"{spec['accepted']}/{spec['drafted']} drafts accepted, " if spec["drafted"] else "")
        + f"{elapsed:.1f}s" + (f" -> {args.output}" if args.output else ""),
        file=sys.stderr,
    )
    return 0
