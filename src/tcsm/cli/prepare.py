"""`tcsm prepare`: tokenise a corpus once into memory-mapped token shards, for `data.kind=shards`.

INPUT is any mix of files, globs and folders: .txt / .gz (a file is one document, or pieces between
--doc-separator), .jsonl(.gz) (one document per line, its --text-field), .parquet and `datasets.save_to_disk`
folders (tcsm[datasets]). --tokenizer is char, gpt2:DIR (encoder.json + vocab.bpe), bpe:N (trained here on the
training documents), or a Hugging Face tokenizer.json or tokenizer folder. Documents are held out for validation
and test by a hash of their text. See tcsm.data.prepare and tcsm.data.shards.

    tcsm prepare my_texts/ -o shards/mine --tokenizer gpt2:../shared/data/gpt2_bpe --workers 4
    tcsm train data.kind=shards data.path=shards/mine data.seq_len=128 -o runs/mine

--task NAME writes a verifiable task's problems instead (tcsm.data.tasks.records, docs/tasks.md): train.jsonl and
test.jsonl of prompt / completion records, and an lm-eval task under lmeval/:

    tcsm prepare --task sudoku -o tasks/sudoku --num-train 20000
"""

from __future__ import annotations

import argparse

HELP = "tokenise files, folders, JSONL, Parquet or datasets into token shards (data.kind=shards)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("inputs", nargs="*", metavar="INPUT", help="files, globs or folders")
    p.add_argument("-o", "--output", required=True, help="folder to write the shards and index.json into")
    p.add_argument("--tokenizer", help="char | gpt2:DIR | bpe:N | PATH/tokenizer.json | tokenizer folder (required "
                   "unless --task)")
    p.add_argument("--workers", type=int, default=1, help="tokenising processes (default 1)")
    p.add_argument("--val-fraction", type=float, default=0.005, help="share of documents held out for validation")
    p.add_argument("--test-fraction", type=float, default=0.005, help="share of documents held out for test")
    p.add_argument("--packing", choices=("eos", "pad"), default="eos",
                   help="eos: concatenate documents, each ended by EOS (default); pad: one row of --seq-len per document")  # fmt: skip
    p.add_argument("--seq-len", type=int, help="row length for --packing pad")
    p.add_argument("--text-field", help="JSONL field / Parquet or datasets column (default text)")
    p.add_argument("--doc-separator",
                   help="split text files into documents at this string (e.g. '<|endoftext|>', '\\n\\n', '§'; "
                        "backslash escapes are read)")
    p.add_argument("--eos", help="the token that ends a document (default: the tokenizer's own)")
    p.add_argument("--shard-tokens", type=int, default=1 << 28, help="tokens per shard file (default 2^28)")
    p.add_argument("--overwrite", action="store_true", help="replace shards already in the output folder")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    t = p.add_argument_group("a verifiable task's records instead of shards (docs/tasks.md)")
    t.add_argument("--task", metavar="NAME", help="sudoku | countdown | addition")
    t.add_argument("--task-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a task option, e.g. digits=4 (addition), count=4 (countdown); repeatable")
    t.add_argument("--num-train", type=int, default=5000, help="training problems (default 5000)")
    t.add_argument("--num-test", type=int, default=500, help="held-out problems (default 500)")
    t.add_argument("--seed", type=int, default=0, help="seed of the problems (default 0)")


def _run_task(args) -> int:
    from tcsm.data.base import DataError
    from tcsm.data.tasks import make_task
    from tcsm.data.tasks.records import write_task_files

    if args.inputs or args.tokenizer:
        raise DataError("--task writes a task's own problems in its own vocabulary: give no INPUT and no --tokenizer")
    options = {}
    for item in args.task_option:
        key, sep, value = item.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            raise DataError(f"--task-option takes KEY=INTEGER, e.g. digits=4; got {item!r}")
        options[key.strip()] = int(value)
    if args.num_train < 1 or args.num_test < 1:
        raise DataError(f"--num-train and --num-test must be >= 1, got {args.num_train}, {args.num_test}")
    task = make_task(args.task, **options)
    written = write_task_files(task, args.output, num_train=args.num_train, num_test=args.num_test, seed=args.seed)
    for path, lines in written.items():
        print(f"{path}: {lines} lines")
    print(f"{task!r}: prompts of {task.prompt_len} characters, answers of at most {task.answer_len}; lm-eval: "
          f"lm_eval --include_path {args.output}/lmeval --tasks tcsm_{task.name}")
    return 0


def run(args) -> int:
    import shlex
    import sys

    from tcsm.data.base import DataError
    from tcsm.data.prepare import prepare

    if args.task:
        return _run_task(args)
    if not args.inputs or not args.tokenizer:
        raise DataError("tcsm prepare needs INPUT files and --tokenizer (or --task NAME for a task's records)")

    separator = _unescape(args.doc_separator) if args.doc_separator is not None else None
    index = prepare(
        args.inputs,
        args.output,
        args.tokenizer,
        workers=args.workers,
        valid_fraction=args.val_fraction,
        test_fraction=args.test_fraction,
        packing=args.packing,
        seq_len=args.seq_len,
        text_field=args.text_field,
        doc_separator=separator,
        eos=args.eos,
        shard_tokens=args.shard_tokens,
        overwrite=args.overwrite,
        progress=not args.no_progress,
        command=shlex.join(["tcsm", *sys.argv[1:]]),
    )
    s = index["splits"]
    print(
        f"{args.output}: {index['documents']} documents, {index['tokens']} tokens "
        f"(train {s['train']['tokens']}, valid {s['valid']['tokens']}, test {s['test']['tokens']}), "
        f"V={index['vocab_size']}, {index['dtype']} in {sum(len(x['shards']) for x in s.values())} shard(s), "
        f"{index['seconds']:.1f}s"
    )
    for split, fraction in (("valid", args.val_fraction), ("test", args.test_fraction)):
        if s[split]["documents"] == 0:
            flag = f"--{'val' if split == 'valid' else 'test'}-fraction"
            why = f"{flag} 0" if fraction == 0 else f"{index['documents']} documents × {fraction}"
            effect = "a run on it trains without validation" if split == "valid" else "tcsm eval has no test split"
            print(
                f"warning: no document was held out for {split} ({why}): {effect}; raise {flag}, or cut files into "
                "documents with --doc-separator",
                file=sys.stderr,
            )
    return 0


def _unescape(text: str) -> str:
    """Backslash escapes (\\n, \\t, \\u00a7) read, every other character kept as it is: '§' stays '§' (decoding
    its UTF-8 bytes as escapes would give 'Â§', which never matches)."""
    import codecs

    return codecs.decode(text.encode("latin-1", "backslashreplace"), "unicode_escape")
