"""`tcsm finetune rl` end to end on a tiny synthetic run: the log carries the RL curves, the report is written,
and a run stopped and resumed mid rollout-buffer (num_iterations = 3, checkpoint at step 2) logs exactly the losses
of the uninterrupted run."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from train_helpers import restore_torch_threads, tiny, train_addition_run  # noqa: F401

from tcsm.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def last_even(x):
    """Reward 1 when the last token is even (the test's verifiable task)."""
    return (x[:, -1] % 2 == 0).float()


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("rl")
    argv = ["train", "-o", str(root / "pre"), *tiny("data.seq_len=6", "model.max_len=6", "data.vocab_size=4",
            "train.steps=2", "train.eval_every=0", "train.sample_every=0", "sample.num=0")]  # fmt: skip
    torch.manual_seed(0)
    assert main(argv) == 0
    return root / "pre"


def rl(source, out, steps, *extra):
    sys.modules.setdefault("rl_e2e_rewards", sys.modules[__name__])
    return main(["finetune", "rl", "--from", str(source), "--reward", "python:rl_e2e_rewards:last_even", "-G", "3",
                 "--steps", str(steps), "-o", str(out), "--eval-prompts", "0", "objective.prompt_len=2",
                 "objective.num_iterations=3", "train.batch_size=2", "train.save_every=2", "train.log_every=1",
                 "train.device=cpu", "train.threads=1", "train.progress=false", "train.tensorboard=false",
                 "sample.steps=3", "sample.num=0", "optim.lr=1e-2", *extra])  # fmt: skip


def losses(run):
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if r.get("split", "train") == "train" and "loss" in r}


def test_rl_run_logs_the_curves_and_resumes_exactly(source, tmp_path):
    assert rl(source, tmp_path / "full", 5, "--estimator", "elbo", "--upper", "eubo") == 0
    full = losses(tmp_path / "full")
    assert sorted(full) == [1, 2, 3, 4, 5]
    assert {"reward", "accuracy", "kl", "clip_fraction", "adv_std", "ratio"} <= set(full[5])
    assert any(full[s]["ratio"] != 1.0 for s in (2, 3, 5))  # inner iterations see the moved policy

    assert rl(source, tmp_path / "cut", 2, "--estimator", "elbo", "--upper", "eubo") == 0
    assert main(["finetune", "rl", "--resume", "-o", str(tmp_path / "cut"), "--steps", "5", "--eval-prompts", "0"]) == 0
    cut = losses(tmp_path / "cut")
    for s in range(1, 6):
        assert cut[s]["loss"] == full[s]["loss"] and cut[s]["reward"] == full[s]["reward"], s


def test_one_step_estimate_and_the_report(source, tmp_path, capsys):
    assert rl(source, tmp_path / "d1", 1, "--estimator", "one_step", "--eval-prompts", "2") == 0
    report = json.loads((tmp_path / "d1" / "rl_eval.json").read_text())
    assert report["num_prompts"] == 2 and 0 <= report["finetuned_accuracy"] <= 1


def test_bad_settings_are_one_line_errors(source, tmp_path, capsys):
    assert rl(source, tmp_path / "g1", 1, "-G", "1") != 0
    assert rl(source, tmp_path / "ex", 1, "--estimator", "exact") != 0
    err = capsys.readouterr().err
    assert "exact likelihood needs an autoregressive model" in err


def test_exact_estimator_on_an_autoregressive_policy(tmp_path, monkeypatch):
    """An AR run is a policy too: rollouts left to right, ℓ its exact likelihood, validation its exact NLL; the
    fine-tuned run is evaluated and sampled like any run, without its reward (here: no longer importable)."""
    argv = ["train", "-o", str(tmp_path / "ar"), "-c", "causal-lm", "data.kind=synthetic", "data.seq_len=6",
            "model.max_len=6", "data.vocab_size=4", "data.num_train=64", "model.d_model=32", "model.n_layers=1",
            "model.n_heads=2", "train.steps=2", "train.batch_size=8", "train.eval_every=0", "train.sample_every=0",
            "sample.num=0", "train.device=cpu", "train.threads=1", "train.progress=false",
            "train.tensorboard=false"]  # fmt: skip
    torch.manual_seed(0)
    assert main(argv) == 0
    assert rl(tmp_path / "ar", tmp_path / "arrl", 2, "--estimator", "exact", "--eval-prompts", "2") == 0
    rows = losses(tmp_path / "arrl")
    assert rows[2]["kl"] >= 0 and 0 <= rows[2]["accuracy"] <= 1
    assert json.loads((tmp_path / "arrl" / "rl_eval.json").read_text())["num_prompts"] == 2
    monkeypatch.delitem(sys.modules, "rl_e2e_rewards")
    assert main(["eval", str(tmp_path / "arrl"), "--max-examples", "8"]) == 0
    assert main(["sample", str(tmp_path / "arrl"), "-n", "2"]) == 0


def test_reward_finetuning_takes_the_same_reward_from_the_same_command_line(source, tmp_path):
    """Both families of reward-driven fine-tuning, one command-line style: --from RUN --reward SPEC."""
    sys.modules.setdefault("rl_e2e_rewards", sys.modules[__name__])
    assert main(["finetune", "reward", "--from", str(source), "--reward", "python:rl_e2e_rewards:last_even", "-B", "2",
                 "--xt-source", "data", "--steps", "1", "--eval-samples", "2", "-o", str(tmp_path / "tcsm"),
                 "train.batch_size=2", "train.device=cpu", "train.threads=1", "train.progress=false",
                 "train.tensorboard=false", "sample.steps=3", "sample.num=0"]) == 0  # fmt: skip
    assert rl(source, tmp_path / "grpo", 1) == 0
    report = json.loads((tmp_path / "tcsm" / "reward_eval.json").read_text())
    assert report["reward"] == "python:rl_e2e_rewards:last_even"


#: the ids of "+" and "=" in the task run's vocabulary, set by `addition_run` before any reward is called
ADDITION_MARKS: dict = {}
#: a one-step recipe run of `addition_run`, quiet
QUIET = ["--steps", "1", "train.batch_size=2", "train.device=cpu", "train.threads=1", "train.progress=false",
         "train.tensorboard=false", "sample.steps=2", "sample.num=0"]  # fmt: skip


def prompt_is_an_addition(x):
    """Reward 1 when the row's prompt has the 2-digit addition form "dd+dd=" (true of every pinned prompt)."""
    return ((x[:, 2] == ADDITION_MARKS["+"]) & (x[:, 5] == ADDITION_MARKS["="])).float()


@pytest.fixture(scope="module")
def addition_run(tmp_path_factory):
    """A 1-step run on 2-digit addition (a task run: its rows carry their prompts; its options are not the task's
    defaults)."""
    from tcsm.builders.loading import load_checkpoint

    run = train_addition_run(tmp_path_factory.mktemp("addition") / "add")
    data = load_checkpoint(run).build_data()
    ADDITION_MARKS.update({c: data.encode(c)[0] for c in "+="})
    return run


def test_the_held_out_reports_pin_each_task_prompt(addition_run, tmp_path):
    """Both reports' completions keep the held-out rows' own prompts (task rows carry them as a prompt mask); the
    TCSM reward run also trains on completions of its batch's prompts (`--xt-source model`)."""
    sys.modules.setdefault("rl_e2e_rewards", sys.modules[__name__])
    reward = ["--from", str(addition_run), "--reward", "python:rl_e2e_rewards:prompt_is_an_addition"]
    assert main(["finetune", "rl", *reward, "-G", "2", "-o", str(tmp_path / "rl"), "--eval-prompts", "8",
                 *QUIET]) == 0  # fmt: skip
    report = json.loads((tmp_path / "rl" / "rl_eval.json").read_text())
    assert report["num_prompts"] == 8 and report["source_accuracy"] == report["finetuned_accuracy"] == 1.0
    assert main(["finetune", "reward", *reward, "-B", "2", "--xt-source", "model", "--eval-samples", "8",
                 "-o", str(tmp_path / "tcsm"), "target.sample_steps=2", *QUIET]) == 0  # fmt: skip
    report = json.loads((tmp_path / "tcsm" / "reward_eval.json").read_text())
    assert report["num_samples"] == 8 and report["pretrained_reward_mean"] == report["finetuned_reward_mean"] == 1.0


def test_task_rewards_score_the_runs_own_task_options(addition_run, tmp_path):
    """`--reward task:addition` on a run trained on 2-digit addition scores 2-digit addition (the run's data
    options), in GRPO and in TCSM reward tuning alike: the default (3 digits) would read every prompt wrong."""
    from omegaconf import OmegaConf

    from tcsm.builders.assemble import build_components
    from tcsm.builders.config import load_config

    source = ["--from", str(addition_run), "--reward", "task:addition"]
    assert main(["finetune", "rl", *source, "-G", "2", "--eval-prompts", "0", "-o", str(tmp_path / "rl"), *QUIET]) == 0
    assert main(["finetune", "reward", *source, "-B", "2", "--eval-samples", "0", "--xt-source", "model",
                 "-o", str(tmp_path / "tcsm"), "target.sample_steps=2", *QUIET]) == 0  # fmt: skip
    for run, where in (("rl", "objective"), ("tcsm", "target")):
        saved = OmegaConf.to_container(OmegaConf.load(tmp_path / run / "config.yaml"))
        parts = build_components(load_config(base=saved), torch.device("cpu"))
        reward = getattr(parts, where).reward
        assert reward.task.options()["digits"] == 2, run
        rows = parts.data.split("test").x1.long()
        assert torch.equal(reward(rows), torch.ones(len(rows))), run  # the reference answers score 1


def test_reward_tuning_on_a_task_prints_accuracy_as_rl_does(addition_run, tmp_path, capsys):
    capsys.readouterr()
    assert main(["finetune", "reward", "--from", str(addition_run), "--reward", "task:addition", "-B", "2",
                 "--eval-samples", "4", "-o", str(tmp_path / "tcsm"), "target.sample_steps=2", *QUIET]) == 0  # fmt: skip
    report = json.loads((tmp_path / "tcsm" / "reward_eval.json").read_text())
    assert 0 <= report["pretrained_accuracy"] <= 1 and 0 <= report["finetuned_accuracy"] <= 1
    assert "accuracy" in capsys.readouterr().out
