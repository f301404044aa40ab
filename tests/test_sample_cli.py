"""`tcsm sample` end to end on a tiny character-level checkpoint trained here, and its error cases."""

from __future__ import annotations

import json
import shutil

import pytest
from tcsm.cli import main
from tcsm.cli.sample import template_positions

CORPUS = "the cat sat on the mat and the dog ate a hat. " * 60


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A 3-step masked-diffusion run on a character corpus (vocabulary ' .acdeghmnost')."""
    from tcsm.train.config import load_config
    from tcsm.train.trainer import Trainer

    root = tmp_path_factory.mktemp("sample_cli")
    (root / "corpus.txt").write_text(CORPUS)
    cfg = load_config(base={
        "data": {"kind": "text", "path": str(root / "corpus.txt"), "seq_len": 24, "valid_frac": 0.1,
                 "test_frac": 0.1},
        "model": {"preset": "tiny", "d_model": 32, "n_layers": 1, "n_heads": 2, "cond_dim": 16, "max_len": 32,
                  "time_conditioning": False},
        "train": {"steps": 3, "batch_size": 4, "device": "cpu", "ema": 0.9, "eval_every": 0, "eval_examples": 4,
                  "sample_every": 0, "save_every": 0, "progress": False, "tensorboard": False, "log_every": 1},
        "eval": {"batch_size": 4},
        "sample": {"num": 0},
    })
    Trainer(cfg, root / "run", log=lambda s: None).fit()
    return root / "run"


def _sample(capsys, *argv):
    code = main(["sample", *map(str, argv), "--no-progress"])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_unconditional_text_and_jsonl(run_dir, capsys, tmp_path):
    code, out, err = _sample(capsys, run_dir, "-n", 3, "--steps", 8, "--seed", 1)
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 3 and all(len(line) == 24 for line in lines)
    assert set("".join(lines)) <= set(CORPUS)
    assert "3 samples" in err and "network calls" in err
    # Same seed → same samples; jsonl carries the tokens and the settings.
    dest = tmp_path / "s.jsonl"
    code, _, err = _sample(capsys, run_dir, "-n", 3, "--steps", 8, "--seed", 1, "-o", dest)
    assert code == 0, err
    rows = [json.loads(line) for line in dest.read_text().splitlines()]
    assert [r["text"] for r in rows] == lines
    assert all(len(r["tokens"]) == 24 and r["steps"] == 8 and r["seed"] == 1 for r in rows)


def test_prompts_stay_fixed(run_dir, capsys):
    code, out, err = _sample(capsys, run_dir, "-n", 2, "--steps", 6, "--prompt", "the dog", "--prompt", "a hat",
                             "--batch-size", 1, "--temperature", 0.7, "--top-p", 0.9)
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 4
    assert lines[0].startswith("the dog") and lines[1].startswith("the dog")
    assert lines[2].startswith("a hat") and lines[3].startswith("a hat")


def test_infilling_keeps_given_positions(run_dir, capsys, tmp_path):
    template = "the ___ sat on the ___"
    code, out, err = _sample(capsys, run_dir, "-n", 2, "--steps", 5, "--infill", template, "--method", "euler")
    assert code == 0, err
    for line in out.splitlines():
        assert len(line) == 24
        assert all(c == t for c, t in zip(line, template) if t != "_")
    # A JSON template: nulls are filled, ids are kept.
    f = tmp_path / "mask.jsonl"
    f.write_text(json.dumps({"tokens": [3, None, 5] + [None] * 10}) + "\n")
    code, out, err = _sample(capsys, run_dir, "-n", 2, "--steps", 4, "--infill-json", f, "--format", "jsonl")
    assert code == 0, err
    for row in map(json.loads, out.splitlines()):
        assert row["tokens"][0] == 3 and row["tokens"][2] == 5


def test_template_positions_for_a_multi_character_tokenizer():
    enc = {"ab": [7, 8], "c": [9]}
    fixed, values = template_positions("ab__c", enc.__getitem__, "_", 7)
    assert fixed == [True, True, False, False, True, False, False]
    assert values[:2] == [7, 8] and values[4] == 9
    with pytest.raises(ValueError, match="7 tokens long"):
        template_positions("ab__c__", enc.__getitem__, "_", 6)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--steps", "0"], "positive integer"),
        (["--steps", "ten"], "positive integer"),
        (["--top-p", "1.5"], "(0.0, 1.0]"),
        (["--temperature", "0"], "number in"),
        (["--method", "gibbs"], "unknown --method"),
        (["--prompt", "the cat sat on the mat and the dog"], "tokens long"),
        (["--prompt", "XYZ"], "outside the"),
        (["--length", "999"], "maximum length"),
        (["--infill", "a_", "--prompt", "a"], "not several"),
    ],
)
def test_bad_arguments_exit_non_zero_with_one_line(run_dir, capsys, argv, message):
    code, out, err = None, "", ""
    try:
        code, out, err = _sample(capsys, run_dir, *argv)
    except SystemExit as e:  # argparse-level errors exit from inside the parser
        code = e.code
        err = capsys.readouterr().err
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err


def test_missing_and_corrupt_checkpoints(run_dir, capsys, tmp_path):
    code, _, err = _sample(capsys, tmp_path / "nope")
    assert code != 0 and len(err.strip().splitlines()) == 1 and "does not exist" in err
    broken = tmp_path / "broken"
    shutil.copytree(run_dir, broken)
    for step in (broken / "checkpoints").glob("step_*"):
        weights = step / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-7] + b"garbage")
    code, _, err = _sample(capsys, broken)
    assert code != 0 and len(err.strip().splitlines()) == 1 and "corrupt" in err


def test_cached_sampler_for_a_time_independent_masked_model(run_dir, capsys):
    def calls(*argv):
        code, _, err = _sample(capsys, run_dir, "-n", 1, "--steps", 64, *argv)
        assert code == 0, err
        return int(err.split(" network calls")[0].rsplit(" ", 1)[1])

    # MDLM cache (MATH.md §6.2): a call only after a step that revealed something, so at most L + 1 = 25.
    cached, uncached = calls(), calls("--no-cache")
    assert cached <= 25 < uncached <= 64
