"""`tcsm finetune sft` on a tiny character-level run: TRL prompt/completion and `messages` records become rows whose
prompt is pinned, the recipe trains from the pre-trained weights and reports the completion | prompt bound, and chat
records the template cannot render are refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
from train_helpers import restore_torch_threads, tiny  # noqa: F401

from tcsm.builders.config import load_config
from tcsm.cli import main
from tcsm.cli.train import train
from tcsm.data import DataError
from tcsm.data.sft import build_sft

TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}Q: {{ m['content'] }}\n"
    "{% elif m['role'] == 'assistant' %}A: {{ m['content'] }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}A: {% endif %}"
)
FT = ["train.progress=false", "train.tensorboard=false", "train.log_every=1", "train.eval_examples=8",
      "train.batch_size=4", "train.device=cpu", "train.threads=1", "eval.num_t=2", "sample.num=0",
      "objective.eval_num_t=2", "data.pad=.", "data.valid_frac=0.25"]  # fmt: skip


def _text() -> str:
    """A few KB of short lines over a small alphabet (the colon and capitals the chat template writes included)."""
    g = torch.Generator().manual_seed(0)
    words = ["the", "cat", "sat", "on", "a", "mat", "Q", "A", "dog", "ran", "to", "me"]
    lines = []
    for _ in range(600):
        n = int(torch.randint(1, 4, (1,), generator=g))
        lines.append(" ".join(words[int(i)] for i in torch.randint(0, len(words), (n,), generator=g)) + ":")
    return "\n".join(lines) + "\n.\n"  # .: the end-of-response pad


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    text = _text()
    (root / "text.txt").write_text(text, encoding="utf-8")
    data = [f"data.path={root / 'text.txt'}", "data.kind=text", "data.seq_len=32", "data.valid_frac=0.1"]
    with torch.random.fork_rng(devices=[]):
        cfg = load_config("synthetic", tiny("train.steps=4", "train.eval_every=0", "sample.num=0", "model.max_len=32",
                                            *data, synthetic=False))  # fmt: skip
        train(cfg, root / "pre", log=lambda s: None)
    lines = [ln for ln in text.splitlines() if 3 < len(ln) < 12]
    records = [{"prompt": a + "\n", "completion": b} for a, b in zip(lines[0:40:2], lines[1:40:2])]
    chats = [{"messages": [{"role": "user", "content": a}, {"role": "assistant", "content": b}]}
             for a, b in zip(lines[40:80:2], lines[41:80:2])]  # fmt: skip
    conversational = {"prompt": [{"role": "user", "content": "the cat"}], "completion": [{"role": "assistant",
                      "content": "sat on a mat"}]}  # fmt: skip
    (root / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*records, *chats, conversational]))
    (root / "chat.jinja").write_text(TEMPLATE)
    return root, {"kind": "text", "path": str(root / "text.txt"), "seq_len": 32, "valid_frac": 0.1}, records, chats


def test_records_become_prompt_pinned_rows(text_run):
    root, tok_section, records, chats = text_run
    b = build_sft(path=str(root / "sft.jsonl"), tokenizer=tok_section, pad=".", chat_template=str(root / "chat.jinja"),
                  valid_frac=0.0)  # fmt: skip
    assert len(b.train) == len(records) + len(chats) + 1
    rows = {b.decode(r.x1[0][r.prompt_mask[0]]): b.decode(r.x1[0][~r.prompt_mask[0]]) for r in (b.train[i] for i in range(len(b.train)))}
    r = records[0]
    assert rows[r["prompt"]] == (r["completion"] + "." * 32)[: 32 - len(r["prompt"])]
    m = chats[0]["messages"]
    assert rows[f"Q: {m[0]['content']}\nA: "].startswith(m[1]["content"] + "\n.")
    assert rows["Q: the cat\nA: "].startswith("sat on a mat\n.")


def test_finetune_sft_end_to_end(text_run, tmp_path, capsys):
    root, *_ = text_run
    argv = ["finetune", "sft", "--from", str(root / "pre"), "--data", str(root / "sft.jsonl"), "--chat-template",
            str(root / "chat.jinja"), "--steps", "3", "-o", str(tmp_path / "sft"), *FT]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads((tmp_path / "sft" / "summary.json").read_text())
    assert summary["bound"].endswith("completion | prompt") and summary["bpc"] > 0
    assert main(["export", str(tmp_path / "sft"), "-o", str(tmp_path / "hf")]) == 0


def test_chat_records_the_template_cannot_render_are_one_line(text_run, tmp_path, capsys):
    root, tok_section, *_ = text_run
    bad = tmp_path / "sharegpt.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "human", "content": "hi"}, {"role": "gpt", "content": "yo"}]}) + "\n")
    with pytest.raises(DataError, match=r"roles the chat template does not name \(gpt, human\)"):
        build_sft(path=str(bad), tokenizer=tok_section, pad=".", chat_template=TEMPLATE)
    with pytest.raises(DataError, match="no chat template is set"):
        build_sft(path=str(bad), tokenizer=tok_section, pad=".")
    argv = ["finetune", "sft", "--from", str(root / "pre"), "--data", str(bad), "--chat-template", TEMPLATE,
            "-o", str(tmp_path / "x"), *FT]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "roles the chat template does not name" in err


def test_the_reference_recipe_on_a_masked_run_names_whose_recipe_it_is(text_run, tmp_path, capsys):
    """Not "set path.source=uniform", which the masked model then refuses in turn (a loop)."""
    root, *_ = text_run
    argv = ["finetune", "sft", "--from", str(root / "pre"), "--data", str(root / "sft.jsonl"), "--chat-template",
            str(root / "chat.jinja"), "--steps", "1", "-o", str(tmp_path / "x"), "objective.recipe=reference", *FT]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "DiffusionGemma" in err and "objective.recipe=tcsm" in err
    assert "path.source=uniform" not in err
