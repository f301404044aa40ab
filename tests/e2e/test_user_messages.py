"""Nothing a user does loses a run, part four (issue 44, items 4–6): a mistaken input gets one line, not a traceback,
a message that names the right fix, and a refusal before step 0 instead of a silent accept."""

from __future__ import annotations

import json
import sys

import pytest
from train_helpers import restore_torch_threads, tiny  # noqa: F401

from tcsm.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

QUIET = ("train.eval_every=0", "train.sample_every=0")


def _hf(model_name: str, where) -> list[str]:
    """A tiny run's keys without the sizes of tcsm's own denoiser: a Hugging Face model as `model.name`."""
    return [o for o in tiny(*QUIET) if not o.startswith("model.")] + [f"model.name={model_name}",
                                                                       f"model.name_or_path={where}"]  # fmt: skip


def _error(capsys, argv) -> str:
    """Run argv; assert a non-zero exit with exactly one line on stderr and no traceback; return the line."""
    capsys.readouterr()
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


# ------------------------------------------------------------------------------------------------ 4 tracebacks


def test_a_truncated_weight_file_of_a_diffusion_gemma_directory_is_one_line(tmp_path, capsys):
    pytest.importorskip("transformers")
    from diffusion_gemma_helpers import write_dgemma_dir

    d = write_dgemma_dir(tmp_path / "dg")
    weights = d / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    line = _error(capsys, ["sample", d, "-n", "1"])
    assert "cannot load" in line and str(d) in line


def test_a_lora_target_that_is_no_regular_expression_is_one_line(tmp_path, capsys):
    pytest.importorskip("peft")
    line = _error(capsys, ["train", "-o", tmp_path / "r", *tiny(*QUIET, "train.lora.r=2",
                                                                 'train.lora.target_modules=["re:("]')])  # fmt: skip
    assert "train.lora.target_modules" in line and "regular expression" in line
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_a_reward_file_with_a_syntax_error_is_one_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "rw_bad.py").write_text("def r(texts):\n    return [1.0 for t in texts\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from tcsm.rewards.functions import make_reward

    with pytest.raises(ValueError, match=r"cannot import 'rw_bad': SyntaxError.*rw_bad\.py, line \d"):
        make_reward("python:rw_bad:r")


def test_the_lm_eval_adapter_without_lm_eval_is_one_line(capsys, monkeypatch):
    from tcsm.cli import lmeval

    for name in [m for m in sys.modules if m == "lm_eval" or m.startswith("lm_eval.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval raises ImportError
    monkeypatch.setattr(lmeval, "_REGISTERED", {})
    assert lmeval.main(["--tasks", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'tcsm[lmeval]'" in err


# ------------------------------------------------------------------------------------------- 6 silent accepts


@pytest.mark.parametrize("keys, word", [(("train.lora.r=-1",), "train.lora.r must be >= 0"),
                                        (("train.lora.r=2", "train.lora.alpha=-1"), "train.lora.alpha must be > 0"),
                                        (("train.lora.r=0",), "train.lora.r=0 trains all weights")])  # fmt: skip
def test_lora_rank_and_scale_that_would_train_all_weights_are_refused(tmp_path, capsys, keys, word):
    line = _error(capsys, ["train", "-o", tmp_path / "r", *tiny(*QUIET, *keys, "train.lora.target_modules=[qkv]")])
    assert word in line
    assert not (tmp_path / "r").exists()


# ------------------------------------------------------------------------------------------ 5 misleading messages


@pytest.mark.parametrize("family", ["hf_denoiser", "diffusion_gemma"])
def test_a_llada_style_directory_under_another_family_names_hf_masked_dlm(tmp_path, capsys, family):
    pytest.importorskip("transformers")
    from llada_helpers import write_masked_dlm

    d = write_masked_dlm(tmp_path / "llada")
    line = _error(capsys, ["train", "-o", tmp_path / "r", *_hf(family, d)])
    assert "model.name=hf_masked_dlm" in line and "custom code" not in line


def test_a_diffusion_gemma_directory_without_config_or_tokenizer_says_which_file_is_missing(tmp_path, capsys):
    pytest.importorskip("transformers")
    from diffusion_gemma_helpers import tiny_hf, write_dgemma_dir

    big = tmp_path / "dg64"  # 64 ids are too many to stand in for text: the missing tokenizer is what to say
    tiny_hf(V=64, k=4).save_pretrained(big)
    line = _error(capsys, ["sample", big, "-n", "1"])
    assert "has no tokenizer" in line and "vocab_size" not in line
    d = write_dgemma_dir(tmp_path / "dg")
    (d / "config.json").unlink()
    line = _error(capsys, ["train", "-o", tmp_path / "r", *_hf("diffusion_gemma", d)])
    assert "has no config.json" in line and "model_type" not in line


def test_a_lora_adapter_export_takes_overwrite_and_leaks_no_peft_warning(tmp_path, capsys, recwarn):
    pytest.importorskip("peft")
    assert main(["train", "-o", str(tmp_path / "plain"), *tiny(*QUIET, "train.steps=1", "sample.num=0")]) == 0
    assert main(["train", "-o", str(tmp_path / "lora"), *tiny(*QUIET, "train.steps=1", "sample.num=0",
                 "train.lora.r=2", "train.lora.target_modules=[qkv]", f"train.init_from={tmp_path / 'plain'}")]) == 0
    out = tmp_path / "adapter"
    assert main(["export", str(tmp_path / "lora"), "-o", str(out), "--lora-adapter"]) == 0
    first = (out / "adapter_model.safetensors").read_bytes()
    assert "--overwrite" in _error(capsys, ["export", tmp_path / "lora", "-o", out, "--lora-adapter"])
    (out / "adapter_model.safetensors").write_bytes(b"stale")
    assert main(["export", str(tmp_path / "lora"), "-o", str(out), "--lora-adapter", "--overwrite"]) == 0
    assert (out / "adapter_model.safetensors").read_bytes() == first
    assert not [w for w in recwarn if "Could not find a config file" in str(w.message)]
    # a directory that holds anything else is still refused, overwrite or not
    (out / "notes.txt").write_text("mine")
    assert "neither" in _error(capsys, ["export", tmp_path / "lora", "-o", out, "--lora-adapter", "--overwrite"])
    assert (out / "notes.txt").read_text() == "mine"


def test_a_time_blind_uniform_block_denoiser_is_refused(tmp_path, capsys):
    line = _error(capsys, ["train", "-o", tmp_path / "r", *tiny(*QUIET, "path.source=uniform", "path.block_length=8",
                                                                 "model.time_conditioning=false")])  # fmt: skip
    assert "model.time_conditioning=true" in line
    assert not (tmp_path / "r").exists()


def test_an_eos_id_outside_the_vocabulary_is_refused_before_step_0(tmp_path, capsys):
    line = _error(capsys, ["train", "-o", tmp_path / "r", *tiny(*QUIET, "path.block_length=8", "sample.eos_id=999")])
    assert "sample.eos_id=999" in line
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_a_run_inside_another_run_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "-o", str(run), *tiny(*QUIET, "train.steps=1", "sample.num=0")]) == 0
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    line = _error(capsys, ["train", "-o", run / "checkpoints", *tiny(*QUIET, "train.steps=1", "sample.num=0")])
    assert "inside the run" in line and str(run) in line
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before


def test_a_resume_with_nothing_to_do_leaves_config_yaml_as_it_was(tmp_path):
    run = tmp_path / "run"
    assert main(["train", "-o", str(run), *tiny(*QUIET, "train.steps=1", "sample.num=0")]) == 0
    before = (run / "config.yaml").read_bytes()
    assert main(["train", "-o", str(run), "--resume", *tiny(*QUIET, "train.steps=1", "sample.num=0",
                                                              "optim.lr=1e-2")]) == 0  # fmt: skip
    assert (run / "config.yaml").read_bytes() == before


def test_a_tokenizer_with_an_empty_vocabulary_is_refused(tmp_path, capsys):
    tokenizers = pytest.importorskip("tokenizers")
    d = tmp_path / "tok"
    d.mkdir()
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({}, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    (tmp_path / "c.txt").write_text("a b c\n" * 50)
    line = _error(capsys, ["prepare", tmp_path / "c.txt", "-o", tmp_path / "sh", "--tokenizer", d, "--no-progress",
                           "--packing", "pad", "--seq-len", "8"])  # fmt: skip
    assert "vocabulary" in line
    assert not (tmp_path / "sh" / "index.json").exists()
