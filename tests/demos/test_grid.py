"""The grid reward demo end to end at its "test" size (32×32 grid, tiny MLP, a few hundred steps), plus the grid
distribution, the finetune CLI's config assembly and its one-line errors."""

from __future__ import annotations

import json

import pytest
import torch

from tcsm.data.grid import GridDistribution, build_grid, histogram, right_fraction, total_variation


@pytest.fixture(autouse=True)
def _one_thread():
    # Tiny matrices on a shared 2-core machine: intra-op threads only contend (the presets set train.threads=1).
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_grid_distribution_has_modes_in_both_halves():
    d = GridDistribution(128)
    assert d.table.shape == (128, 128) and abs(float(d.table.sum()) - 1) < 1e-12
    assert abs(d.right_mass() - 0.5) < 1e-9  # symmetric ring, no mode on the midline
    left = d.left_restricted()
    assert float(left[64:].sum()) == 0 and abs(float(left.sum()) - 1) < 1e-12
    x = d.sample(20000, torch.Generator().manual_seed(0))
    assert 0.48 < right_fraction(x, 128) < 0.52
    assert total_variation(histogram(x, 128), d.table) < 0.2
    bundle = build_grid(width=16, num_train=100, num_valid=10, num_test=10)
    assert bundle.vocab_size == 16 and bundle.seq_len == 2 and bundle.decode(torch.tensor([3, 4])) == "(3,4)"


def test_grid_demo_removes_the_right_half(tmp_path):
    """Pre-train on a 32×32 grid, fine-tune with N^full toward R = 0 | −1e5: right-half mass < 1% afterwards
    (data: 50%); the figure and metrics JSON are written. ~20 s on one core."""
    from tcsm.demos.grid import run_grid_demo

    metrics = run_grid_demo(tmp_path, size="test", num_samples=3000, sample_steps=16, log=lambda s: None)
    assert metrics["right_fraction_before"] > 0.4
    assert metrics["right_fraction_after"] < 0.01
    # the remaining mass sits on the left modes: coarse TV to p_1 | left well below the 0.5 of "nothing learnt"
    assert metrics["tv_after_to_left_data_8x8_bins"] < 0.25
    assert (tmp_path / "grid_dynamics.png").stat().st_size > 10_000
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["right_fraction_after"] == metrics["right_fraction_after"]
    # the fine-tuning run is an ordinary run: its checkpoint names the reward target and logs its statistics
    rows = [json.loads(line) for line in (tmp_path / "finetune" / "metrics.jsonl").read_text().splitlines()]
    assert any("target/groups_skipped" in r for r in rows)


def test_finetune_cli_config_and_errors(tmp_path, capsys):
    """`tcsm finetune reward` assembles pre-trained config < preset < overrides < flags; user errors are one line."""
    from tcsm.builders.config import load_config
    from tcsm.cli import main
    from tcsm.cli.train import train
    from tcsm.recipes.reward.compose import reward_config

    pre = tmp_path / "pre"
    cfg = load_config(
        "demo-grid",
        [
            "data.width=8",
            "data.num_train=256",
            "model.hidden=16",
            "train.steps=2",
            "train.batch_size=8",
            "train.eval_examples=8",
            "train.progress=false",
            "sample.num=0",
        ],
    )
    train(cfg, pre)
    ft = reward_config(
        pre, "finetune-grid", ["optim.lr=1e-3"], {"target.beta": 0.5, "target.reward": "grid:right=-3"}
    )
    assert ft.target.name == "reward" and ft.target.beta == 0.5 and ft.target.reward == "grid:right=-3"
    assert (
        ft.model.name == "grid_mlp" and ft.model.hidden == 16 and ft.data.width == 8 and ft.optim.lr == 1e-3
    )
    assert ft.train.out_dir is None and str(pre) in ft.reference.path

    out = tmp_path / "ft"
    argv = [
        "finetune",
        "reward",
        "-k",
        str(pre),
        "-c",
        "finetune-grid",
        "-o",
        str(out),
        "--steps",
        "3",
        "-B",
        "2",
        "--eval-samples",
        "16",
        "target.pool_size=16",
        "target.sample_steps=4",
        "train.batch_size=4",
        "train.progress=false",
        "sample.num=0",
        "train.eval_examples=8",
        "sample.steps=4",
    ]
    assert main(argv) == 0
    report = json.loads((out / "reward_eval.json").read_text())
    assert {"pretrained_reward_mean", "finetuned_reward_mean"} <= set(report)
    assert (
        main(["finetune", "reward", "--resume", "-o", str(out), "--steps", "4", "--eval-samples", "0"]) == 0
    )
    assert json.loads((out / "summary.json").read_text())["step"] == 4
    # N^1: explicit tilted conditionals through the same command (V reward calls per loss position)
    n1 = tmp_path / "n1"
    opts = argv[argv.index("target.pool_size=16") :]
    n1_argv = [
        "finetune",
        "reward",
        "-k",
        str(pre),
        "-c",
        "finetune-grid",
        "-o",
        str(n1),
        "--neighbourhood",
        "n1",
        "--xt-source",
        "data",
        "--steps",
        "2",
        "--eval-samples",
        "0",
        *opts,
    ]
    assert main(n1_argv) == 0
    assert json.loads((n1 / "summary.json").read_text())["step"] == 2

    capsys.readouterr()
    assert main(["finetune", "reward", "-o", str(tmp_path / "x")]) == 2
    assert "--checkpoint" in capsys.readouterr().err
    assert main(["finetune", "reward", "-k", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tcsm finetune: error:") and len(err.strip().splitlines()) == 1
    assert main(["finetune", "reward", "-k", str(pre), "--reward", "nope", "-o", str(tmp_path / "y")]) == 2
    assert "unknown reward" in capsys.readouterr().err
