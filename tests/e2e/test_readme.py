"""Every `tcsm` command line of README.md runs (issue 21, item 4): the ```bash blocks are parsed, each `tcsm ...`
line is run in-process through the CLI's main with settings that make it tiny (train steps, model size, sample
counts), and must exit 0. What a line needs but no line makes is made first, each as small as the lines are made:
the runs it names but no line trains (runs/tinystories, runs/synthetic, runs/uniform, runs/bpe-model) and the
files it reads (my_book.txt, my.yaml). The README's long presets read data this test does not ship (text8), so
their runs are trained on my_book.txt at the README's own character level; a line that sets data.* itself keeps
its data settings untouched (that is what the README example `data.seq_len=128` tests)."""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
from pathlib import Path

import pytest
from train_helpers import ROOT, restore_torch_threads  # noqa: F401

from tcsm.cli import main

#: Lines of the README's bash blocks that are not `tcsm` commands, and why this test does not run them.
NOT_TCSM = {
    "./scripts/setup.sh": "installs the package (this test runs inside the installed package)",
    "./scripts/setup.sh --test": "installs the package with test extras",
    ".venv/bin/python -m pytest": "runs the test suite this test belongs to",
}
#: Placeholders of README lines that stand for the user's own files; lines holding one are not run, and why.
PLACEHOLDERS = {
    "path/to/local-bert-or-gpt2": "the user's local Hugging Face model (tests/models/test_hf_denoiser.py builds tiny ones)",
}
DATA = Path(os.environ.get("TCSM_DATA_DIR") or ROOT / ".." / "shared" / "data")
BOOK = "my_book.txt"
#: The README's long presets read text8 (not shipped with the tests): their runs read my_book.txt instead.
TEXT8_PRESETS = (
    "text8-paper",
    "text8-prefix-small",
    "causal-lm",
    "hollow",
    "mlm",
    "parametric-student",
)
TEXT = ("data.kind=text", f"data.path={BOOK}", "data.seq_len=48")  # 48: the README samples in blocks of 16
TRAIN = (
    "train.steps=2",
    "train.batch_size=4",
    "train.eval_every=0",
    "train.sample_every=0",
    "train.progress=false",
    "train.tensorboard=false",
    "train.compile=false",
    "train.precision=fp32",
    "train.device=cpu",
    "train.threads=1",
    "train.eval_examples=8",
    "eval.num_t=2",
    "eval.batch_size=8",
    "sample.num=2",
    "sample.steps=4",
    "optim.warmup=0",
)
MODEL = ("model.preset=tiny",)
RECIPE = ("--steps", "1")
#: Flags appended per command (argparse keeps the last value of a repeated flag, so these win).
FLAGS = {
    "prepare": ("--workers", "1", "--no-progress"),
    "sample": ("-n", "2", "--steps", "4", "--no-progress"),
    "eval": ("--max-examples", "4", "--num-t", "2", "--batch-size", "4"),
    "pairs": ("-n", "16", "--steps", "4"),
    "finetune reward": (*RECIPE, "-B", "2", "--eval-samples", "0"),
    "finetune preference": (*RECIPE, "--eval-samples", "0"),
    "finetune dre": (*RECIPE, "--eval-examples", "4"),
    "finetune sft": (*RECIPE, "data.pad=.", "data.valid_frac=0.25"),
    "finetune rl": (*RECIPE, "-G", "2", "--eval-prompts", "2"),
    "finetune fewstep": RECIPE,  # the preset's window (1); a joint round (--form joint) takes none
    "distill": (*RECIPE, "--eval-samples", "2", "--eval-steps", "2"),
    "demo grid": (
        "--size",
        "test",
        "--samples",
        "64",
        "--steps",
        "2",
        "--pretrain",
        "train.steps=2",
        "--finetune",
        "train.steps=1",
    ),
}


def readme_commands() -> list[list[str]]:
    """The README's bash lines as argument lists (continuations joined, comments dropped, `&&` chains split)."""
    text = (ROOT / "README.md").read_text()
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            while words:
                cut = words.index("&&") if "&&" in words else len(words)
                lines.append(words[:cut])
                words = words[cut + 1 :]
    return lines


def tcsm_argv(words: list[str]) -> list[str] | None:
    """The argument list a line gives `tcsm` (`tcsm ...`, `.venv/bin/tcsm ...`, `torchrun ... -m tcsm.cli ...`),
    or None for a line that is not a tcsm command (it must be one of NOT_TCSM)."""
    if Path(words[0]).name == "tcsm":
        return words[1:]
    # torchrun: one process here; the multi-process path has its own test (test_distributed.py)
    if words[0] == "torchrun":
        return words[words.index("tcsm.cli") + 1 :]
    assert " ".join(words) in NOT_TCSM, (
        f"README line {' '.join(words)!r} is neither a tcsm command nor listed"
    )
    return None


def _command(argv: list[str]) -> str:
    return " ".join(argv[:2]) if argv[0] in ("finetune", "demo") else argv[0]


def _option(argv, *names) -> str | None:
    for i, a in enumerate(argv[:-1]):
        if a in names:
            return argv[i + 1]
    return None


def shrink(argv: list[str]) -> list[str]:
    """The same command with tiny settings; its own arguments stay, so the README's settings are what is tested."""
    cmd, words = _command(argv), set(argv)
    if "--help" in words or "--resume" in words:
        return argv
    if cmd in ("train", "quickstart"):
        preset = _option(argv, "-c", "--config")
        sets_data = any(a.startswith("data.") for a in argv)
        data = TEXT if preset in TEXT8_PRESETS and not sets_data else ()
        return [*argv, *data, *MODEL, *TRAIN]
    if cmd in ("finetune reward", "finetune preference", "finetune dre", "finetune rl", "distill"):
        # pairs drawn from an untrained model often tie on reward and are dropped: few are left to train on
        few = ("train.batch_size=1",) if cmd == "finetune preference" else ()
        return [*argv, *FLAGS[cmd], *(o for o in TRAIN if o != "train.steps=2"), *few]
    if cmd == "eval" and "--genppl" in words:
        return [*argv, "--num-samples", "2", "--steps", "2,4"]
    if cmd == "prepare":  # the README names the shared data relative to the repository
        return [*(a.replace("../shared/data", str(DATA)) for a in argv), *FLAGS[cmd]]
    if cmd == "eval" and "--zeroshot" in words:
        return [*argv, "--data-root", str(DATA), "--max-documents", "2", "--num-t", "1", "--batch-size", "4"]
    return [*argv, *FLAGS.get(cmd, ())]


def _runs_named(argv) -> set[str]:
    return {m for a in argv for m in re.findall(r"runs/[\w.-]+", a)}


def in_dependency_order(commands: list[list[str]]) -> list[list[str]]:
    """Lines that write a run (-o runs/X) before the lines that read it; otherwise in README order."""
    made = {_option(a, "-o", "--out"): i for i, a in enumerate(commands) if "--resume" not in a}
    order, done = [], set()
    while len(order) < len(commands):
        for i, a in enumerate(commands):
            if i in done:
                continue
            mine = made.get(_option(a, "-o", "--out")) if "--resume" not in a else None
            needs = {made[r] for r in _runs_named(a) if r in made and made[r] != mine}
            if needs <= done:
                order.append(a)
                done.add(i)
                break
        else:
            raise AssertionError("README commands read each other's runs in a cycle")
    return order


def _prerequisites(root: Path, commands: list[list[str]]) -> list[list[str]]:
    """Commands making what the README lines read but do not make."""
    (root / BOOK).write_text(
        " ".join(
            itertools.islice(
                itertools.cycle(
                    [
                        "Once upon a time, there was a little cat.",
                        "The quick brown fox jumps over the lazy dog.",
                        "She was happy and sang a song.",
                        "It is a good day, said the old man.",
                    ]
                ),
                400,
            )
        )
    )
    (root / "my.yaml").write_text("extends: synthetic\ntrain:\n  steps: 100\n")
    chat = {"messages": [{"role": "user", "content": "the old man"}, {"role": "assistant", "content": "sang a song"}]}
    (root / "chats.jsonl").write_text((json.dumps(chat) + "\n") * 12)
    (root / "tmpl.jinja").write_text(  # in the characters of my_book.txt, the vocabulary of runs/demo
        "{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}, {% elif m['role'] == 'assistant' %}"
        "said {{ m['content'] }}. {% endif %}{% endfor %}{% if add_generation_prompt %}said {% endif %}"
    )
    (root / "my_texts").mkdir()
    for i in range(200):  # a folder of distinct small documents (held-out splits are drawn by document)
        (root / "my_texts" / f"doc{i:03d}.txt").write_text(f"Document {i}. " + (root / BOOK).read_text()[i : i + 1500])
    made = {_option(c, "-o", "--out") for c in commands}
    recipes = {
        "runs/tinystories": ["train", *TEXT],
        "runs/synthetic": ["train"],
        "runs/demo": ["train", *TEXT],  # the Python API example's run
        "runs/uniform": ["train", "path.source=uniform", "model.time_conditioning=true"],
        "runs/bpe-model": [
            "train",
            "data.kind=bpe",
            f"data.path={BOOK}",
            f"data.bpe_dir={DATA / 'gpt2_bpe'}",
            "data.seq_len=32",
        ],
    }
    needed = sorted(r for c in commands for r in _runs_named(c) if r not in made)
    unknown = sorted(set(needed) - set(recipes))
    assert not unknown, f"README lines read runs no line makes and this test does not know: {unknown}"
    return [[*recipes[r][:1], "-o", r, *recipes[r][1:], *MODEL, *TRAIN] for r in dict.fromkeys(needed)]


@pytest.mark.slow  # ~40 commands end to end: about 30 s of CPU
@pytest.mark.timeout(300)
def test_every_readme_command_line_runs(tmp_path, monkeypatch, capsys):
    lines = readme_commands()
    commands = [a for a in map(tcsm_argv, lines) if a is not None and not any(p in w for p in PLACEHOLDERS for w in a)]
    assert len(commands) >= 30 and any("data.seq_len=128" in a for a in commands)
    has_bpe = (DATA / "gpt2_bpe" / "encoder.json").is_file() and (DATA / "ptb").is_dir()
    if not has_bpe:  # the zero-shot sets and GPT-2's BPE files are data the tests cannot download
        needs_bpe = ("--zeroshot", "shards/", "runs/mine", "gpt2:")
        commands = [a for a in commands if not any(n in w for n in needs_bpe for w in a)]
    monkeypatch.chdir(tmp_path)
    count = itertools.count()
    monkeypatch.setattr(
        "tcsm.cli.common.default_run_dir", lambda label: Path("runs") / f"{label}-{next(count)}"
    )
    failures = []
    for argv in [*_prerequisites(tmp_path, commands), *map(shrink, in_dependency_order(commands))]:
        try:
            code = main(argv)
        except SystemExit as e:  # --help
            code = e.code
        err = capsys.readouterr().err.strip()
        if code != 0:
            failures.append(f"tcsm {shlex.join(argv)} -> {code}: {err.splitlines()[-1] if err else ''}")
    assert not failures, "\n".join(failures)
