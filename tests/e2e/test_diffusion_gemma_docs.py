"""docs/huggingface.md's DiffusionGemma commands as they are written, on a tiny random checkpoint directory with its
own word-level tokenizer: prepare → import (train.steps=0) → truncated bound → SFT with LoRA (reference recipe) →
reward fine-tuning → PEFT adapter export → the model's own generate() on the run and on the directory; then the
documented Python lines load the adapter onto transformers' own class (no tcsm) and give tcsm's logits."""

from __future__ import annotations

import json
import re
import shlex

import pytest
import torch
from diffusion_gemma_helpers import WORDS, write_dgemma_dir
from train_helpers import ROOT, restore_torch_threads  # noqa: F401

import tcsm
from tcsm.cli import main

tf = pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("tokenizers")
if not hasattr(tf, "DiffusionGemmaForBlockDiffusion"):
    pytest.skip("this transformers has no DiffusionGemma", allow_module_level=True)

pytestmark = pytest.mark.usefixtures("one_thread")

COMMON = ["train.device=cpu", "train.threads=1", "train.progress=false", "train.tensorboard=false",
          "train.precision=fp32", "train.eval_every=0", "train.sample_every=0", "sample.num=0", "train.batch_size=4",
          "sample.steps=2", "train.eval_examples=8"]  # fmt: skip
#: what makes each documented command tiny (appended: the documented keys stay as written)
SHRINK = {"train": COMMON, "eval": ["--json", "--max-examples", "4", "--num-t", "2"],
          "finetune": [*COMMON, "--steps", "2", "optim.lr=3e-2"],
          "sample": ["-n", "2", "--no-progress", "--seed", "1"]}  # fmt: skip
EXTRA = {("finetune", "sft"): ["data.valid_frac=0.25", "objective.eval_num_t=1"], ("finetune", "reward"): ["-B", "2", "--eval-samples", "2"]}


def _section() -> str:
    text = (ROOT / "docs" / "huggingface.md").read_text(encoding="utf-8")
    start = text.index("## DiffusionGemma")
    return text[start : text.index("\n## ", start + 1)]


def _block(section: str, lang: str) -> str:
    start = section.index(f"```{lang}\n") + len(lang) + 4
    return section[start : section.index("```", start)]


def test_the_documented_diffusion_gemma_commands_run_as_written(tmp_path, monkeypatch, capsys):
    from peft import PeftModel

    write_dgemma_dir(tmp_path / "dgemma")
    stories = [" ".join(WORDS[(i * 5 + j * 3) % len(WORDS)] for j in range(5 + i % 6)) for i in range(60)]
    (tmp_path / "stories.txt").write_text("\n".join(stories))
    recs = [{"prompt": "Once upon a time", "completion": " the cat sat ."}, {"prompt": "the day", "completion": " was good"}]
    (tmp_path / "recs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs * 8))
    monkeypatch.chdir(tmp_path)
    section = _section()
    commands = [shlex.split(line)[1:] for line in _block(section, "bash").strip().splitlines() if line.startswith("tcsm ")]
    assert [c[0] for c in commands] == ["prepare", "train", "eval", "finetune", "finetune", "export", "sample", "sample"]
    outputs = []
    for argv in commands:
        extra = SHRINK.get(argv[0], []) + EXTRA.get(tuple(argv[:2]), [])
        capsys.readouterr()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            assert main([*argv, *extra]) == 0, (argv, capsys.readouterr().err)
        outputs.append(capsys.readouterr().out)
    # the bound: the truncated time reversal plus its reconstruction term, labelled as such
    bound = json.loads(outputs[2])
    assert "t_max=0.95" in json.dumps(bound) and 0 < bound["bpc"] < 100
    # the reward run trained the SFT run's adapters further; the export is PEFT's adapter directory
    assert (tmp_path / "dg-adapter" / "adapter_config.json").is_file()
    # both documented samples: text of the tokenizer's words, from the model's own generate()
    for text in outputs[-2:]:
        words = re.findall(r"\S+", text)
        assert words and set(words) <= set(WORDS) | {"<pad>", "<eos>", "<bos>"}
    # the documented Python lines, run as written: transformers' own class with the adapter is the tuned run
    scope: dict = {}
    exec(_block(section, "python"), scope)  # noqa: S102  (the repository's own documentation, run as written)
    assert isinstance(scope["model"], PeftModel) and scope["out"].shape[1] > scope["ids"].shape[1]
    ours, theirs = tcsm.from_pretrained(tmp_path / "runs" / "dg-rw"), scope["model"].eval()
    g = torch.Generator().manual_seed(0)
    x1, xt = (torch.randint(0, ours.vocab_size, (2, 12), generator=g) for _ in range(2))
    with torch.no_grad():
        logits = ours(xt, None, x1=x1)
        own = theirs(input_ids=x1[:, :4], decoder_input_ids=xt[:, 4:8]).logits
    torch.testing.assert_close(own, logits[:, 4:8], atol=1e-5, rtol=0)
