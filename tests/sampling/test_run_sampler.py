"""A run samples the same way in training and from the command line (DESIGN.md "samplers through the contract"):
the trainer's logged samples and `tcsm sample` both come from `tcsm.sampling.settings` with the run's `sample:`
settings, for the path samplers and for an energy model's SIR; old `objective.sir_*` keys are read as `sample.*`."""

from __future__ import annotations

import pytest
import torch
from train_helpers import restore_torch_threads, tiny  # noqa: F401

from tcsm.builders.config import load_config
from tcsm.cli import main
from tcsm.cli.train import train
from tcsm.core.errors import ConfigError
from tcsm.sampling.settings import SampleSettings
from tcsm.train.trainer import Trainer


def _cli_texts(capsys, run, *flags) -> list[str]:
    capsys.readouterr()
    assert main(["sample", str(run), "--no-progress", *flags]) == 0
    return capsys.readouterr().out.splitlines()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny masked run whose sample: section is not the sampler's defaults (euler, cosine grid, T = 0.7, 5 steps)."""
    root = tmp_path_factory.mktemp("contract")
    cfg = load_config("synthetic", tiny("train.steps=4", "train.eval_every=0", "sample.num=3", "sample.seed=5",
                                        "sample.steps=5", "sample.method=euler", "sample.grid=cosine",
                                        "sample.temperature=0.7"))
    with torch.random.fork_rng(devices=[]):
        train(cfg, root / "run", log=lambda s: None)
    return root / "run"


def test_the_trainer_and_tcsm_sample_draw_the_same_sequences(run, capsys):
    trainer = Trainer.from_config(load_config(base=_saved_config(run)), None, resume=run)
    logged = trainer.samples()
    assert len(logged) == 3
    assert _cli_texts(capsys, run, "-n", "3", "--seed", "5") == logged
    # a flag overrides the run's setting, and then the draws differ
    assert _cli_texts(capsys, run, "-n", "3", "--seed", "5", "--temperature", "1") != logged


def test_the_run_settings_reach_the_sampler(run):
    from tcsm.builders.loading import load_checkpoint
    from tcsm.sampling.settings import build_sampler

    ck = load_checkpoint(run)
    s = build_sampler(ck.config, ck.model, ck.build_path(), None).settings
    assert (s.method, s.grid, s.temperature, s.steps) == ("euler", "cosine", 0.7, 5)
    s = build_sampler(ck.config, ck.model, ck.build_path(), None, steps=9, grid=None).settings
    assert (s.steps, s.grid) == (9, "cosine")


def test_old_sir_keys_are_read_as_sample_keys_with_a_note(capsys):
    cfg = load_config("finetune-dre", ["objective.sir_k=5", "objective.sir_window=[0.0,1.0]"])
    assert cfg.sample.sir_k == 5 and list(cfg.sample.sir_window) == [0.0, 1.0]
    assert "sir_k" not in cfg.objective
    err = capsys.readouterr().err
    assert "objective.sir_k is now sample.sir_k" in err
    saved = load_config(base={"objective": {"name": "dre", "sir_k": 3}})  # a saved run: migrated silently
    assert saved.sample.sir_k == 3 and "sir_k" not in capsys.readouterr().err
    with pytest.raises(ConfigError, match="both set"):
        load_config("finetune-dre", ["objective.sir_k=5", "sample.sir_k=4"])


@pytest.mark.parametrize(
    "bad, match",
    [("sample.method=leap", "method"), ("sample.grid=log", "grid"), ("sample.top_p=0", "top_p"),
     ("sample.sir_window=[0.7,0.2]", "sir_window"), ("sample.steps=0", "steps")],
)
def test_bad_sampler_settings_are_one_line_config_errors(bad, match):
    with pytest.raises(ConfigError, match=match):
        load_config("synthetic", [bad])


def test_sample_settings_check_themselves():
    with pytest.raises(ValueError, match="method"):
        SampleSettings(method="leap")
    assert SampleSettings(sir_window=[0, 1]).sir_window == (0.0, 1.0)


def _saved_config(run):
    from tcsm.storage.checkpoint import read_state, resolve_checkpoint

    return read_state(resolve_checkpoint(run))[1]["config"]


def test_an_energy_run_samples_by_sir_with_its_own_settings_in_both(tmp_path, capsys):
    """Strategy (ii): the run's sample.sir_k / sir_window / sir_temperature reach SIR in the trainer and in
    `tcsm sample` (which used to ignore them): same draws, and the reported sampler is SIR."""
    with torch.random.fork_rng(devices=[]):
        train(load_config("synthetic", tiny("train.steps=3", "train.eval_every=0", "sample.num=0")), tmp_path / "ref",
              log=lambda s: None)
    flags = ["train.progress=false", "train.tensorboard=false", "train.device=cpu", "train.threads=1",
             "train.batch_size=8", "train.eval_examples=0", "sample.num=2", "sample.steps=4", "sample.seed=2",
             "sample.sir_k=3", "sample.sir_window=[0.0,1.0]", "sample.sir_temperature=0.5"]
    assert main(["finetune", "dre", "--from", str(tmp_path / "ref"), "-o", str(tmp_path / "ii"), "--steps", "2",
                 "--eval-examples", "0", *flags]) == 0
    run = tmp_path / "ii"
    trainer = Trainer.from_config(load_config(base=_saved_config(run)), None, resume=run)
    logged = trainer.samples()
    capsys.readouterr()
    assert main(["sample", str(run), "--no-progress", "-n", "2", "--seed", "2"]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines() == logged and "sir sampler" in out.err


def test_decoding_orders_through_tcsm_sample(run, capsys):
    """The decoding orders and blocks are selectable from the command line; the run's prompt is kept."""
    for flags in (["--method", "margin", "--steps", "4"], ["--method", "threshold", "--threshold", "0.5"],
                  ["--method", "confidence", "--steps", "4", "--semi-ar-block", "4"]):
        capsys.readouterr()
        assert main(["sample", str(run), "--no-progress", "-n", "2", "--length", "8", *flags]) == 0
        out = capsys.readouterr()
        assert len(out.out.splitlines()) == 2 and flags[1] + " sampler" in out.err


@pytest.mark.parametrize(
    "flags, match",
    [(["--method", "greedy"], r"--method: invalid choice: 'greedy' \(choose from 'ancestral'"),
     (["--method", "margin", "--semi-ar-block", "3"], "block length 3 does not divide the sample length 8"),
     (["--method", "threshold", "--threshold", "1.5"], r"sample.threshold must be in \(0, 1\], got 1.5"),
     (["--method", "entropy", "--steps", "9"], "9 steps for 8 positions")],
)
def test_bad_decoding_requests_are_one_line_errors(run, capsys, flags, match):
    import re

    capsys.readouterr()
    try:
        rc = main(["sample", str(run), "--no-progress", "--length", "8", *flags])
    except SystemExit as e:  # argparse rejects a bad value before the command runs
        rc = e.code
    assert rc != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(match, err), err


@pytest.mark.parametrize("bad, match", [("sample.threshold=0", "threshold"), ("sample.semi_ar_block=0", "semi_ar_block"),
                                        ("sample.block_length=0", "semi_ar_block"),
                                        ("sample.method=greedy", "method")])
def test_bad_decoding_settings_are_config_errors(bad, match):
    with pytest.raises(ConfigError, match=match):
        load_config("synthetic", [bad])


@pytest.mark.parametrize("invariant", [True, False])
def test_sample_batch_invariant_reaches_the_models_calls(run, invariant):
    from tcsm.builders.loading import load_checkpoint
    from tcsm.models.layers import batch_invariant
    from tcsm.sampling.settings import build_sampler

    ck = load_checkpoint(run)
    seen, forward = [], ck.model.forward
    ck.model.forward = lambda *a, **k: seen.append(batch_invariant()) or forward(*a, **k)
    sampler = build_sampler(ck.config, ck.model, ck.build_path(), None, batch_invariant=invariant)
    sampler(2, 8, generator=torch.Generator().manual_seed(0))
    assert seen and set(seen) == {invariant} and batch_invariant()
