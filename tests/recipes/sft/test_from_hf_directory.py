"""`tcsm finetune sft --from DIR` on a Hugging Face diffusion LM directory as transformers wrote it (a DiffusionGemma
checkpoint, a LLaDA-style masked model with its own code): the directory is imported into the run (RUN/source, the
run `tcsm train ... train.steps=0` makes: family, source, block length and tokenizer from the directory's own
config), the records bring the text, and the run resumes from itself."""

from __future__ import annotations

import builtins
import json

import pytest
import torch
from diffusion_gemma_helpers import write_dgemma_dir
from llada_helpers import write_masked_dlm
from omegaconf import OmegaConf
from train_helpers import restore_torch_threads  # noqa: F401

from tcsm.cli import main

tf = pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("tokenizers")

pytestmark = pytest.mark.usefixtures("one_thread")

COMMON = ["train.device=cpu", "train.threads=1", "train.progress=false", "train.tensorboard=false",
          "train.precision=fp32", "train.eval_every=0", "train.sample_every=0", "sample.num=0", "train.batch_size=4",
          "sample.steps=2", "train.eval_examples=8", "data.valid_frac=0.25", "objective.eval_num_t=1"]  # fmt: skip


@pytest.fixture(autouse=True)
def no_prompt(monkeypatch):
    """No load may stop at transformers' trust_remote_code question."""
    monkeypatch.setattr(builtins, "input", lambda *a, **k: (_ for _ in ()).throw(AssertionError("prompted")))


def _records(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows * 8))
    return str(path)


def _run(capsys, *argv) -> str:
    capsys.readouterr()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        rc = main(list(argv))
    out = capsys.readouterr()
    assert rc == 0, out.err
    return out.out


def test_sft_from_a_diffusion_gemma_directory_imports_it_into_the_run_and_resumes(tmp_path, monkeypatch, capsys):
    write_dgemma_dir(tmp_path / "dgemma")
    recs = _records(tmp_path / "recs.jsonl", [{"prompt": "Once upon a time", "completion": " the cat sat ."},
                                              {"prompt": "the day", "completion": " was good"}])  # fmt: skip
    run = tmp_path / "runs" / "sft"
    monkeypatch.chdir(tmp_path)
    out = _run(capsys, "finetune", "sft", "--from", "dgemma", "--data", recs, "-o", "runs/sft", "data.seq_len=12",
               "objective.recipe=reference", "eval.t_max=0.95", *COMMON, "--steps", "2")  # fmt: skip
    assert "importing 'dgemma'" in out and "completion | prompt bound" in out
    source = OmegaConf.load(run / "source" / "config.yaml")  # the import: the directory's own family, canvas, tokenizer
    assert (source.model.name, source.model.name_or_path) == ("diffusion_gemma", str(tmp_path / "dgemma"))
    assert (source.path.source, source.path.block_length, source.data.kind) == ("uniform", 4, "tokenizer")
    cfg = OmegaConf.load(run / "config.yaml")
    assert cfg.train.init_from == str(run / "source" / "checkpoints" / "step_00000000")  # absolute, inside the run
    assert cfg.data.kind == "sft" and cfg.data.tokenizer.path == str(tmp_path / "dgemma")
    monkeypatch.chdir("/")  # the run reads nothing relative to where it was made
    _run(capsys, "finetune", "sft", "--resume", "-o", str(run), *COMMON, "--steps", "3")
    assert (run / "checkpoints" / "step_00000003").is_dir()


def test_sft_from_a_llada_directory_and_eval_and_export_of_the_directory(tmp_path, monkeypatch, capsys):
    write_masked_dlm(tmp_path / "llada")
    recs = _records(tmp_path / "recs.jsonl", [{"prompt": "the quick", "completion": " brown fox jumps"},
                                              {"prompt": "a cat", "completion": " sat on mat"}])  # fmt: skip
    monkeypatch.chdir(tmp_path)
    _run(capsys, "finetune", "sft", "--from", "llada", "--data", recs, "-o", "runs/sft", "data.seq_len=8",
         "model.trust_remote_code=true", "train.lora.r=2", "train.lora.target_modules=[q_proj,v_proj]", *COMMON,
         "--steps", "2")  # fmt: skip
    cfg = OmegaConf.load(tmp_path / "runs" / "sft" / "config.yaml")
    assert (cfg.model.name, cfg.path.source, cfg.train.lora.r) == ("hf_masked_dlm", "masked", 2)
    # the directory itself: eval needs text and says which in one line; export writes the model's own directory
    capsys.readouterr()
    assert main(["eval", "llada", "model.trust_remote_code=true"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no text to read a valid split from" in err and "data.kind=shards" in err
    _run(capsys, "export", "llada", "-o", "llada-out", "--trust-remote-code")
    assert json.loads((tmp_path / "llada-out" / "config.json").read_text())["mask_token_id"] is not None
