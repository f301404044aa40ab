"""`tcsm pairs` and `tcsm finetune preference` end to end on a tiny synthetic run (seconds): pairs from the model's
own samples, a fine-tune that starts at the reference, exact resume, evaluation of the run, one-line errors."""

from __future__ import annotations

import json
import math

import pytest
import torch
from train_helpers import assert_same_weights, final_weights, restore_torch_threads, tiny  # noqa: F401

from tcsm.builders.config import load_config
from tcsm.cli import main
from tcsm.cli.train import train


def count_a(x: torch.Tensor) -> torch.Tensor:
    """The judge of these tests (`--reward python:test_preference_cli:count_a`): how many "a" (token 0) a sample has."""
    return (x == 0).float().sum(-1)


REWARD = "python:test_preference_cli:count_a"
FT = ["train.progress=false", "train.tensorboard=false", "train.log_every=1", "train.eval_every=0",
      "train.eval_examples=16", "train.batch_size=8", "train.device=cpu", "train.threads=1", "objective.eval_num_t=2"]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    root = tmp_path_factory.mktemp("pref")
    with torch.random.fork_rng(devices=[]):
        train(load_config("synthetic", tiny("train.steps=15", "train.eval_every=0", "sample.num=0")), root / "pre",
              log=lambda s: None)
    return root / "pre"


@pytest.fixture(scope="module")
def pairs(pretrained):
    out = pretrained.parent / "pairs.jsonl"
    argv = ["pairs", "--from", str(pretrained), "--reward", REWARD, "-n", "48", "--steps", "4", "-o", str(out),
            "--prompt", "ab", "--prompt", "c", "--group", "3"]
    assert main(argv) == 0
    return out


def test_pairs_are_best_and_worst_of_each_group_under_the_reward(pairs, capsys):
    rows = [json.loads(line) for line in pairs.read_text().splitlines()]
    assert len(rows) == 48 and {r["prompt"] for r in rows} == {"ab", "c"}
    for r in rows:
        assert r["chosen"] != r["rejected"] and r["chosen_reward"] > r["rejected_reward"]
        assert r["chosen_reward"] == r["chosen"].count("a") + r["prompt"].count("a")  # judged on the whole sequence
        assert len(r["prompt"] + r["chosen"]) == 16  # a response fills the model's length after its prompt
        assert len(r["prompt_ids"] + r["chosen_ids"]) == 16 and r["tokenizer"].endswith("/V=8")


def test_finetune_starts_at_the_reference_learns_and_keeps_it_frozen(pretrained, pairs, tmp_path, capsys):
    """Step 1 is computed at θ = ref (init_from): Δ = 0, so the paper loss is exactly
    softplus(log β) + softplus(−log β) = log(1 + β) + log(1 + 1/β); the held-out
    metrics are logged; the reference checkpoint is untouched; `tcsm eval` and `tcsm sample` read the run."""
    before = final_weights(pretrained, "ema")
    out = tmp_path / "ft"
    argv = ["finetune", "preference", "--from", str(pretrained), "--pairs", str(pairs), "--loss", "paper",
            "--beta", "2", "--steps", "12", "-o", str(out), "--eval-reward", REWARD, "--eval-samples", "8",
            "--eval-prompt", "ab", "optim.lr=3e-3", "optim.warmup=1", *FT]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in rows if r["kind"] == "train" and r["step"] == 1)
    assert first["loss"] == pytest.approx(math.log(3) + math.log(1.5), abs=1e-6) and first["margin"] == 0
    assert "48 with their stored token ids" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert {"pref_accuracy", "reward_margin", "kl_ref", "pref_loss"} <= set(summary) and summary["kl_ref"] > 0
    assert summary["num_pairs"] == 4  # valid_frac 0.1 of 48
    report = json.loads((out / "preference_eval.json").read_text())
    assert report["num_samples"] == 8 and report["reference_example"].startswith("ab")
    assert {"reference_reward_mean", "finetuned_reward_mean", "finetuned_entropy", "pref_accuracy"} <= set(report)
    assert_same_weights(final_weights(pretrained, "ema"), before)
    after = final_weights(out)
    assert any(not torch.equal(after[k], before[k]) for k in before)
    assert main(["eval", str(out), "--json"]) == 0
    assert main(["sample", str(out), "-n", "2", "--steps", "4"]) == 0


@pytest.mark.parametrize("loss", ["paper", "dpo"])
def test_finetune_resumes_exactly(pretrained, pairs, tmp_path, loss):
    common = ["finetune", "preference", "--from", str(pretrained), "--pairs", str(pairs), "--loss", loss]
    assert main([*common, "--steps", "6", "-o", str(tmp_path / "full"), *FT]) == 0
    assert main([*common, "--steps", "3", "-o", str(tmp_path / "part"), *FT, "train.save_every=3"]) == 0
    assert main(["finetune", "preference", "--resume", "-o", str(tmp_path / "part"), "--steps", "6"]) == 0
    assert_same_weights(final_weights(tmp_path / "full"), final_weights(tmp_path / "part"))
    assert_same_weights(final_weights(tmp_path / "full", "ema"), final_weights(tmp_path / "part", "ema"))


def test_user_mistakes_are_one_line_errors(pretrained, pairs, tmp_path, capsys):
    def err(argv) -> str:
        capsys.readouterr()
        assert main(argv) == 2
        text = capsys.readouterr().err
        assert len(text.strip().splitlines()) == 1, text
        return text

    ft = ["finetune", "preference", "--from", str(pretrained)]
    assert "--pairs" in err([*ft, "-o", str(tmp_path / "a")])
    assert "not found" in err([*ft, "--pairs", str(tmp_path / "none.jsonl")])
    assert "--beta must be > 0" in err([*ft, "--pairs", str(pairs), "--beta", "0"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "chosen": "b", "rejected": "b"}\n{"chosen": "c"}\n')
    assert "no usable preference pair" in err([*ft, "--pairs", str(bad), "-o", str(tmp_path / "b"), *FT])
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": "abc", "chosen": "a" * 20, "rejected": "b" * 20}) + "\n")
    assert "data.truncate=true" in err([*ft, "--pairs", str(long), "-o", str(tmp_path / "c"), *FT])
    assert "unknown reward" in err(["pairs", "--from", str(pretrained), "--reward", "nope", "-o", str(tmp_path / "p")])
    assert "group" in err(["pairs", "--from", str(pretrained), "--reward", REWARD, "--group", "1", "-o",
                           str(tmp_path / "p")])
    assert "no room" in err(["pairs", "--from", str(pretrained), "--reward", REWARD, "--prompt", "a" * 16, "-o",
                             str(tmp_path / "p")])
