"""Nothing a user does loses a run, part two (issue 21): the post-training commands. --overwrite never costs the
old run when the new one cannot start, and never deletes the run the new one starts from (item 1); `tcsm sample`
draws a causal-LM run left to right (item 2); the messages and silent accepts of item 5 say what is true."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from train_helpers import restore_torch_threads, tiny  # noqa: F401

from tcsm.cli import main

QUIET = ("train.eval_every=0", "train.sample_every=0", "sample.num=0")
FT = (
    "train.progress=false",
    "train.tensorboard=false",
    "train.batch_size=8",
    "train.device=cpu",
    "train.threads=1",
)


def _error(capsys, argv) -> str:
    """Run argv; a non-zero exit with exactly one line on stderr and no traceback; return the line."""
    capsys.readouterr()
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    assert code != 0 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def _snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A tiny synthetic denoiser run, an energy (DRE strategy ii) run from it, and a tiny causal-LM run."""
    root = tmp_path_factory.mktemp("runs")
    assert main(["train", "-o", str(root / "pre"), *tiny(*QUIET, "train.steps=2")]) == 0
    argv = [
        "finetune",
        "dre",
        "--from",
        root / "pre",
        "-o",
        root / "dre",
        "--steps",
        "1",
        "--eval-examples",
        "0",
    ]
    assert main([str(a) for a in [*argv, *FT, "objective.log_z_samples=[1]"]]) == 0
    keys = [o for o in tiny(*QUIET, "train.steps=2") if not o.startswith(("model.cond_dim", "eval.num_t"))]
    ar = [
        "train",
        "-o",
        str(root / "ar"),
        "model.name=causal",
        "model.preset=tiny",
        "objective.name=lm",
        *keys,
    ]
    assert main(ar) == 0
    pairs = root / "pairs.jsonl"
    pairs.write_text(
        "".join(
            json.dumps({"prompt": "", "chosen": "abcdefgh" * 2, "rejected": "hgfedcba" * 2}) + "\n"
            for _ in range(8)
        )
    )
    return root


# --------------------------------------------------------------------------------------------------- 1 --overwrite


def test_an_overwrite_that_cannot_start_leaves_the_old_run_whole(runs, tmp_path, capsys):
    """`--from RUN_DRE --overwrite -o EXISTING` deleted EXISTING's checkpoints and summary, then failed: an energy
    run is not a denoiser. The refusal now comes first, and EXISTING is byte for byte what it was."""
    existing = tmp_path / "existing"
    shutil.copytree(runs / "pre", existing)
    before = _snapshot(existing)
    pref = ["finetune", "preference", "--from", runs / "dre", "--pairs", runs / "pairs.jsonl", "--steps", "1"]
    line = _error(capsys, [*pref, "--overwrite", "-o", existing])
    assert "energy model" in line and "diffusion denoiser" in line
    reward = ["finetune", "reward", "-k", runs / "dre", "--reward", "python:math:fsum", "--steps", "1"]
    line = _error(capsys, [*reward, "--overwrite", "-o", existing])
    assert "energy model" in line
    assert _snapshot(existing) == before


@pytest.mark.parametrize("recipe", ["dre", "reward", "preference"])
def test_an_overwrite_of_the_run_it_starts_from_is_refused(runs, tmp_path, capsys, recipe):
    """`tcsm finetune dre --from X --overwrite -o X` destroyed the weights it was about to start from."""
    source = tmp_path / "x"
    shutil.copytree(runs / "pre", source)
    before = _snapshot(source)
    extra = {
        "dre": [],
        "reward": ["--reward", "python:math:fsum"],
        "preference": ["--pairs", runs / "pairs.jsonl"],
    }
    argv = ["finetune", recipe, "--from", source, *extra[recipe], "--steps", "1", *FT]
    for out in (source, source / "checkpoints"):
        line = _error(capsys, [*argv, "--overwrite", "-o", out])
        # the run itself: overwriting it is refused; its checkpoints/ folder: nesting a run in a run is refused first
        assert ("--overwrite" in line if out == source else "inside the run" in line) and str(source) in line
    assert _snapshot(source) == before


# --------------------------------------------------------------------------------------------------- 2 causal LM


def test_sample_draws_a_causal_lm_run_left_to_right(runs, capsys):
    """It ended in `TypeError: CausalLM.forward() takes 2 positional arguments but 3 were given`."""
    capsys.readouterr()
    assert main(["sample", str(runs / "ar"), "-n", "3", "--no-progress"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and all(len(s) == 16 and set(s) <= set("abcdefgh") for s in out)
    assert main(["sample", str(runs / "ar"), "-n", "2", "--prompt", "abc", "--no-progress"]) == 0
    assert all(s.startswith("abc") for s in capsys.readouterr().out.splitlines())
    line = _error(capsys, ["sample", runs / "ar", "--infill", "ab" + "_" * 14])
    assert "infill" in line and "left to right" in line


# --------------------------------------------------------------------------------------------------- 5 messages


def test_overrides_are_accepted_after_flags(runs, capsys):
    """ "unrecognized arguments: train.batch_size=16" when an override came after a flag."""
    capsys.readouterr()
    argv = [
        "finetune",
        "dre",
        "--from",
        str(runs / "pre"),
        "--steps",
        "3",
        "train.batch_size=16",
        "--strategy",
        "ii",
        "train.seed=7",
        "--print-config",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "batch_size: 16" in printed and "seed: 7" in printed and "steps: 3" in printed


def test_distill_has_the_overwrite_it_suggests(runs, tmp_path, capsys):
    """`tcsm distill` said "pass --overwrite" and had no --overwrite."""
    existing = tmp_path / "s"
    shutil.copytree(runs / "pre", existing)
    line = _error(capsys, ["distill", "--teacher", runs / "ar", "-o", existing, "--steps", "1"])
    assert "--overwrite" in line
    student = [o for o in tiny(*QUIET, "optim.decay=constant") if not o.startswith("data.")]
    argv = [
        "distill",
        "--teacher",
        runs / "ar",
        "-o",
        existing,
        "--overwrite",
        "--steps",
        "1",
        "--eval-samples",
        "0",
        *student,
    ]
    assert main([str(a) for a in argv]) == 0
    assert "name: distill" in (existing / "config.yaml").read_text()


def test_a_pairs_field_of_the_wrong_type_is_not_called_missing(runs, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        "".join(json.dumps({"prompt": "", "chosen": 12, "rejected": "ab"}) + "\n" for _ in range(4))
    )
    line = _error(
        capsys, ["finetune", "preference", "--from", runs / "pre", "--pairs", bad, "-o", tmp_path / "p"]
    )
    assert "non-string 'chosen'" in line and "missing" not in line


def test_reward_accepts_from_like_the_other_recipes(runs, capsys):
    capsys.readouterr()
    argv = [
        "finetune",
        "reward",
        "--from",
        str(runs / "pre"),
        "--reward",
        "python:math:fsum",
        "--print-config",
    ]
    assert main(argv) == 0
    assert str(runs / "pre") in capsys.readouterr().out


@pytest.mark.parametrize("recipe, steps", [("reward", 500), ("preference", 300), ("dre", 500)])
def test_recipe_help_shows_the_recipes_own_defaults(capsys, recipe, steps):
    """Recipe --help pages showed the synthetic preset's defaults (train.steps=2500)."""
    with pytest.raises(SystemExit):
        main(["finetune", recipe, "--help"])
    text = capsys.readouterr().out
    assert f"  train.steps={steps}  " in text and "train.steps=2500" not in text


def test_sir_flags_on_a_run_that_is_not_an_energy_model_are_refused(runs, capsys):
    line = _error(capsys, ["sample", runs / "pre", "-n", "1", "--sir-k", "3"])
    assert "--sir-k" in line and "energy model" in line


def test_eval_max_examples_zero_is_refused(runs, capsys):
    """It evaluated the whole split."""
    line = _error(capsys, ["eval", runs / "pre", "--max-examples", "0"])
    assert "--max-examples must be >= 1" in line


def test_dre_reference_outside_strategy_i_is_refused(runs, tmp_path, capsys):
    line = _error(
        capsys,
        [
            "finetune",
            "dre",
            "--from",
            runs / "pre",
            "--strategy",
            "ii",
            "--reference",
            "ema",
            "-o",
            tmp_path / "d",
        ],
    )
    assert "--reference belongs to strategy i" in line
    assert not (tmp_path / "d").exists()


def test_a_resume_of_another_recipes_run_is_refused_and_writes_nothing(runs, capsys):
    """`finetune preference --resume -o RUN_DRE` exited 0 with "nothing to do" and wrote a file into that run."""
    before = _snapshot(runs / "dre")
    line = _error(capsys, ["finetune", "preference", "--resume", "-o", runs / "dre"])
    assert "`tcsm finetune dre` run" in line and "tcsm finetune dre --resume" in line
    assert _snapshot(runs / "dre") == before


def test_a_grid_reward_on_a_sequence_model_is_refused_before_any_work(runs, tmp_path, capsys):
    """`--reward grid` on a sequence model was accepted (by tcsm pairs and --eval-reward as well)."""
    line = _error(
        capsys, ["pairs", "--from", runs / "pre", "--reward", "grid", "-n", "4", "-o", tmp_path / "p.jsonl"]
    )
    assert "grid" in line and "data.kind=grid" in line and not (tmp_path / "p.jsonl").exists()
    argv = [
        "finetune",
        "preference",
        "--from",
        runs / "pre",
        "--pairs",
        runs / "pairs.jsonl",
        "--eval-reward",
        "grid",
        "-o",
        tmp_path / "f",
        "--steps",
        "1",
    ]
    line = _error(capsys, argv)
    assert "grid" in line and not (tmp_path / "f" / "checkpoints").exists()
