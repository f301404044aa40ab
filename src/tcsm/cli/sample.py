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

HELP = "draw samples from a trained checkpoint (prompts, infilling, temperature, top-p)"


def _one_line_error(self, message: str):
    # Bad values (non-numbers, unknown choices) get the same one-line form as every other user error.
    self.exit(2, f"tcsm sample: error: {message}\n")


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def _method(text: str) -> str:
    from tcsm.sampling.registry import sampler_names

    if text not in sampler_names():
        raise argparse.ArgumentTypeError(f"unknown --method {text!r}; choose one of {', '.join(sampler_names())}")
    return text


def _token_id_or_none(text: str) -> int | str:
    if text == "none":
        return text
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a token id >= 0 or none, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a token id >= 0 or none, got {text!r}")
    return v


def _float_in(lo: float, hi: float, lo_open: bool = True):
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        ok = (v > lo if lo_open else v >= lo) and v <= hi
        if not ok:
            raise argparse.ArgumentTypeError(f"expected a number in {'(' if lo_open else '['}{lo}, {hi}], got {text!r}")
        return v

    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.error = types.MethodType(_one_line_error, p)
    p.epilog = __doc__.split("\n\n", 1)[1] + "\nExample: tcsm sample runs/my-run -n 8 --steps 256 --prompt 'the cat' -o s.jsonl"
    p.add_argument("checkpoint", help="run directory, checkpoints directory or step_* directory")
    p.add_argument("-n", "--num-samples", type=_positive_int, default=4,
                   help="samples (per prompt / template when given); default 4")
    p.add_argument("--steps", type=_positive_int, default=None,
                   help="sampler steps K, per block for a block model (default: the run's sample.steps; a causal LM "
                        "run takes one step per position)")
    from tcsm.sampling.registry import sampler_class, sampler_names

    names = sampler_names()
    orders = ", ".join(n for n in names if sampler_class(n).steps_at_most_positions)
    p.add_argument("--method", default=None, choices=names, type=_method, metavar="METHOD",
                   help=f"sampler: {' | '.join(names)} (default: the run's sample.method, else ancestral for masked, "
                        f"analytic for uniform; {orders} are decoding orders for masked models)")
    p.add_argument("--block-length", type=_positive_int, default=None,
                   help="masked full-sequence models: decode blocks of this many positions left to right, uncached, "
                        "--method inside each (default: the run's sample.block_length; block models decode their own)")
    p.add_argument("--threshold", type=_float_in(0.0, 1.0), default=None,
                   help="--method threshold: unmask every position whose confidence exceeds this, in (0, 1] "
                        "(default: the run's sample.threshold)")
    p.add_argument("--grid", default=None, help="time grid: uniform | cosine (default: the run's sample.grid)")
    p.add_argument("--temperature", type=_float_in(0.0, float("inf")), default=None,
                   help="softmax temperature > 0 (default: the run's sample.temperature)")
    p.add_argument("--top-p", type=_float_in(0.0, 1.0), default=None,
                   help="nucleus mass in (0, 1]; 1 = off (default: the run's sample.top_p)")
    p.add_argument("--seed", type=int, default=0, help="seed of every random draw (default 0)")
    p.add_argument("--length", type=_positive_int, default=None,
                   help="sequence length (default: the training sequence length)")
    p.add_argument("--max-new-tokens", type=_positive_int, default=None, metavar="N",
                   help="exactly N new tokens after each prompt (without one: N tokens; a block model draws its "
                        "last block whole and cuts it), up to the model's positions (instead of --length)")
    p.add_argument("--eos", type=_token_id_or_none, default=None, metavar="ID",
                   help="end a sample at this generated token id (a block model stops decoding there), or none "
                        "(default: the run's sample.eos_id, else the data's end-of-sequence token (task and SFT runs), "
                        "else for a block model the tokenizer's)")
    p.add_argument("--batch-size", type=_positive_int, default=16, help="sequences per sampler call (memory)")
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
    p.add_argument("--no-ema", action="store_true", help="use the raw weights instead of the EMA weights")
    p.add_argument("--no-cache", action="store_true",
                   help="call the network at every step even for a time-independent masked model")
    p.add_argument("--final-argmax", action="store_true", help="take the most likely token at the last step")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--sir-k", type=_positive_int, default=None,
                   help="energy-model runs (tcsm finetune dre): SIR candidates per step (default: the run's sample.sir_k)")
    p.add_argument("--sir-window", nargs=2, type=_float_in(0.0, 1.0, lo_open=False), default=None,
                   metavar=("LO", "HI"), help="energy-model runs: α_t window of the SIR steps (default: the run's)")
    p.add_argument("--drafter", default=None, metavar="PATH",
                   help="--method speculative: the drafter's run / checkpoint / exported directory, an AR LM or a "
                        "masked denoiser (default: the run's sample.drafter, else the model drafts from its last pass)")
    p.add_argument("--draft-length", type=_positive_int, default=None,
                   help="--method speculative: positions drafted per model pass (default: the run's sample.draft_length)")
    p.add_argument("--sir-temperature", type=_float_in(0.0, float("inf")), default=None,
                   help="energy-model runs: SIR selection ∝ softmax(f / T) (default: the run's sample.sir_temperature)")


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


def _run_sampler(loaded, model, path, device, args):
    """The run's sampler (`tcsm.sampling.settings`: the same one its training samples used) with the flags given.
    A run whose objective cannot be rebuilt here (e.g. its reference run is gone) has no sampler of its own: only
    energy-model and causal-LM runs do, and their objectives read nothing but the model."""
    from tcsm.builders.assemble import build_objective_for_checkpoint
    from tcsm.builders.components import DataInfo
    from tcsm.core.errors import TCSMError
    from tcsm.sampling.settings import build_sampler

    try:
        objective = build_objective_for_checkpoint(loaded.config, model, DataInfo(**loaded.data_info), device)
    except TCSMError:
        objective = None
    sampler = build_sampler(
        loaded.config, model, path, objective, steps=args.steps, method=args.method, grid=args.grid,
        temperature=args.temperature, top_p=args.top_p, final_argmax=args.final_argmax or None,
        cache=False if args.no_cache else None, sir_k=args.sir_k,
        sir_window=None if args.sir_window is None else tuple(args.sir_window), sir_temperature=args.sir_temperature,
        block_length=args.block_length, threshold=args.threshold, drafter=args.drafter, draft_length=args.draft_length,
    )  # fmt: skip
    if sampler.settings.drafter and (sampler.settings.method or "") == "speculative":
        from tcsm.builders.loading import load_drafter

        sampler.drafter_model = load_drafter(sampler.settings.drafter, device, path.vocab_size)
    return sampler


def run(args) -> int:
    import torch

    from tcsm.builders.loading import load_checkpoint
    from tcsm.cli.common import check_writable
    from tcsm.core.progress import WorkProgress
    from tcsm.data.base import readable_text
    from tcsm.sampling.common import GRIDS, row_evaluations
    from tcsm.storage.fileio import write_atomically
    from tcsm.train.distributed import resolve_device

    if args.grid is not None and args.grid not in GRIDS:
        raise ValueError(f"unknown --grid {args.grid!r}; choose uniform or cosine")
    conditioned = bool(args.prompt) + bool(args.infill) + bool(args.infill_json)
    if conditioned > 1:
        raise ValueError("give prompts, infilling templates or --infill-json, not several kinds at once")
    fmt = args.format or ("jsonl" if (args.output or "").endswith(".jsonl") else "text")
    if args.output:  # before any work: a bad path must not cost a sampling run
        check_writable(args.output, overwrite=args.overwrite)

    device = resolve_device(args.device)
    loaded = load_checkpoint(args.checkpoint, device=device, ema=not args.no_ema)
    model, path = loaded.model, loaded.build_path()
    from tcsm.models.kinds import kind_of

    kind = kind_of(model)
    sir = kind.sampler == "sir"  # strategy-(ii) DRE run: SIR over its frozen reference (MATH.md §6.3)
    if kind.sampler == "none":
        family = str(loaded.config.model.get("name", kind.family))
        raise ValueError(f"{loaded.directory} holds a {family} LM: its single-site conditionals "
                         "p(x^i | x^≠i) give no sampler of whole sequences (it is a teacher for target.name=parametric)")
    ar = kind.sampler == "left_to_right"  # a causal LM (an AR teacher): drawn left to right, prompts first
    if ar and (args.infill or args.infill_json):
        raise ValueError("a causal LM run is sampled left to right: it can continue a --prompt, not fill a template "
                         "(--infill / --infill-json need a diffusion run)")
    from tcsm.sampling.registry import sampler_class

    verifies = bool(args.method) and sampler_class(args.method).replaces_own  # speculative decoding of the AR model
    if ar and ((args.method and not verifies) or args.final_argmax or args.grid or args.no_cache or args.steps
               or args.block_length or args.threshold is not None):
        raise ValueError("a causal LM run is sampled left to right, one token per step: --steps, --method, --grid, "
                         "--final-argmax, --no-cache, --block-length and --threshold are diffusion sampler options")
    if sir and (args.method or args.temperature is not None or args.top_p is not None or args.final_argmax):
        raise ValueError("an energy model is sampled by SIR: use --sir-k/--sir-window/--sir-temperature, not --method/"
                         "--temperature/--top-p/--final-argmax")
    if not sir and (args.sir_k is not None or args.sir_window is not None or args.sir_temperature is not None):
        raise ValueError(f"--sir-k, --sir-window and --sir-temperature sample an energy model (tcsm finetune dre "
                         f"strategy ii); {loaded.directory} holds a {type(model).__name__}")
    if sir and args.sir_window is not None and args.sir_window[0] > args.sir_window[1]:
        raise ValueError(f"--sir-window needs LO <= HI, got {args.sir_window[0]} {args.sir_window[1]}")
    block = int(model.block_length) if kind.blocks else None  # decoded block by block with its KV cache
    if block and args.block_length:
        raise ValueError(f"--block-length decodes a full-sequence model in uncached blocks; {loaded.directory} holds a "
                         f"block model, decoded by its own blocks of {block} with its KV cache: leave it out")
    if args.max_new_tokens is not None and (args.length is not None or args.infill or args.infill_json):
        raise ValueError("--max-new-tokens sets the length after a prompt: give it without --length, --infill or "
                         "--infill-json")
    V = path.vocab_size
    length = args.length or int(loaded.data_info["seq_len"])
    max_len = getattr(getattr(model, "cfg", None), "max_len", None)
    if max_len is not None and length > max_len:
        raise ValueError(f"--length {length} exceeds the model's maximum length {max_len}")
    tok = load_tokenizer(loaded)

    def length_after(prompt_len: int) -> int:
        """The length drawn for a prompt of `prompt_len` tokens: `length`, or the prompt and --max-new-tokens
        rounded up to whole blocks."""
        if args.max_new_tokens is None:
            return length
        n = generation_length(prompt_len, args.max_new_tokens, block)
        if max_len is not None and n > max_len:
            raise ValueError(f"--max-new-tokens {args.max_new_tokens} after {prompt_len} prompt tokens needs length {n}, "
                             f"beyond the model's maximum length {max_len}")  # fmt: skip
        return n

    # One group per prompt / template; every group gets num_samples samples.
    groups: list[dict] = []
    if args.prompt:
        for text in args.prompt:
            ids = list(tok.encode(text))
            n = length_after(len(ids))
            if len(ids) > n:
                raise ValueError(f"prompt {text[:30]!r} is {len(ids)} tokens long but samples have length {n}")
            fixed = [True] * len(ids) + [False] * (n - len(ids))
            groups.append({"fixed": fixed, "values": ids + [0] * (n - len(ids)), "info": {"prompt": text},
                           "keep": None if args.max_new_tokens is None else len(ids) + args.max_new_tokens})
    elif args.infill:
        for text in args.infill:
            fixed, values = template_positions(text, tok.encode, args.placeholder, length)
            groups.append({"fixed": fixed, "values": values, "info": {"template": text}})
    elif args.infill_json:
        for fixed, values, toks in _read_infill_json(args.infill_json, length, V):
            groups.append({"fixed": fixed, "values": values, "info": {"template_tokens": toks}})
    else:
        groups.append({"fixed": None, "values": None, "info": {}, "length": length_after(0), "keep": args.max_new_tokens})
    for g in groups:
        g["length"] = g.get("length") or len(g["fixed"])
        if g["values"] is not None and any(v >= V for v in g["values"]):
            raise ValueError(f"the tokenizer produced ids outside the model's {V}-token vocabulary")

    sampler = _run_sampler(loaded, model, path, device, args)
    if block:  # tcsm's block decoding stops a row at --eos, else the run's, else the tokenizer's
        eos = sampler.settings.eos_id if args.eos is None else (None if args.eos == "none" else args.eos)
        eos = getattr(tok, "eos_id", None) if eos is None and args.eos is None else eos
        sampler.settings = dataclasses.replace(sampler.settings, eos_id=eos)
    # where a sample's text ends: the same, else the data's end of sequence (task, SFT runs)
    eos_id = getattr(sampler.settings, "eos_id", None) if args.eos is None else (None if args.eos == "none" else args.eos)
    if eos_id is None and args.eos is None:
        eos_id = loaded.data_eos_id()
    if eos_id is not None and not 0 <= eos_id < V:
        raise ValueError(f"--eos {eos_id} is not a token id of the {V}-token vocabulary")
    settings = sampler.settings
    generator = torch.Generator(device=device).manual_seed(int(args.seed))
    chunks = [(g, min(args.batch_size, args.num_samples - s)) for g in groups
              for s in range(0, args.num_samples, args.batch_size)]
    steps = length if ar else settings.steps  # a causal LM draws one position per step
    # steps per chunk: a causal LM one per position, a block model `steps` per block
    per_chunk = [g["length"] if ar else g["length"] // block * steps if block else steps for g, _ in chunks]
    bar = WorkProgress(sum(per_chunk), "sampling", "steps", enabled=not args.no_progress)
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
    if settings.method == "threshold" and not sampler.own:  # its steps follow from the threshold: the most taken
        steps = taken

    meta = {"checkpoint": str(loaded.directory), "step": loaded.step, "weights": loaded.weights,
            "method": stats.method, "steps": steps, "grid": settings.grid, "temperature": settings.temperature,
            "top_p": settings.top_p, "seed": args.seed}
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
