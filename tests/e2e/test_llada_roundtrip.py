"""A LLaDA-style masked diffusion LM directory (its own modeling code, written by the test) goes the whole way with the
CLI: imported as it is (train.steps=0) → its masked bound (tcsm eval) → SFT with LoRA → reward fine-tuning with the
reference shared as the adapters-off model → export (merged) → reloaded by its own class through
`AutoModel.from_pretrained(DIR, trust_remote_code=True)`, logits equal to tcsm's → decoded with tcsm's samplers."""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest
import torch
from llada_helpers import WORDS, write_masked_dlm
from train_helpers import restore_torch_threads, tiny  # noqa: F401

import tcsm
from tcsm.cli import main

tf = pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("tokenizers")

COMMON = ["train.device=cpu", "train.threads=1", "train.progress=false", "train.tensorboard=false", "train.eval_every=0",
          "train.sample_every=0", "sample.num=0", "sample.steps=4", "train.batch_size=4", "eval.num_t=2",
          "train.eval_examples=8"]  # fmt: skip


@pytest.fixture(autouse=True)
def no_prompt(monkeypatch):
    """No load may stop at transformers' trust_remote_code question."""
    monkeypatch.setattr(builtins, "input", lambda *a, **k: (_ for _ in ()).throw(AssertionError("prompted")))


def test_a_llada_directory_goes_load_bound_sft_lora_reward_export_reload_generate(tmp_path, capsys):
    from tcsm.data.prepare import prepare

    d = write_masked_dlm(tmp_path / "llada")
    (tmp_path / "c.txt").write_text("\n".join(" ".join(WORDS[i % 7 : i % 7 + 6]) for i in range(60)))
    prepare([str(tmp_path / "c.txt")], tmp_path / "shards", str(d / "tokenizer.json"), doc_separator="\n",
            progress=False, valid_fraction=0.2, test_fraction=0)  # fmt: skip
    args = [o for o in tiny("data.kind=shards", "data.windows=random", f"data.path={tmp_path / 'shards'}",
                            "data.seq_len=12", synthetic=False) if not o.startswith("model.")]  # fmt: skip
    model_args = ["model.name=hf_masked_dlm", f"model.name_or_path={d}", "model.trust_remote_code=true"]
    # load: the directory as it is becomes a run (no step taken)
    assert main(["train", "-o", str(tmp_path / "run"), *args, *model_args, "train.steps=0"]) == 0
    imported = tcsm.from_pretrained(tmp_path / "run")
    own = tf.AutoModel.from_pretrained(str(d), trust_remote_code=True).eval()
    x = torch.randint(0, 17, (3, 12))
    with torch.no_grad():
        assert torch.equal(imported(x)[..., :15], own(input_ids=imported.input_ids(x)).logits[..., :15])
    # bound
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run"), "--json"]) == 0
    bound = json.loads(capsys.readouterr().out)
    assert bound["bound"].startswith("masked") and bound["nats_per_token"] > 0 and bound["nats_per_token_stderr"] > 0
    # SFT with LoRA (LLaDA's recipe: the prompt is never masked, the loss is on the response)
    recs = [{"prompt": "the quick", "completion": "brown fox jumps"}, {"prompt": "a cat", "completion": "sat on mat"}] * 8
    (tmp_path / "sft.jsonl").write_text("\n".join(json.dumps(r) for r in recs))
    lora = ["train.lora.r=2", "train.lora.target_modules=[q_proj,v_proj]", "optim.lr=3e-2"]
    assert main(["finetune", "sft", "--from", str(tmp_path / "run"), "--data", str(tmp_path / "sft.jsonl"),
                 "--steps", "3", "-o", str(tmp_path / "sft"), *COMMON, *lora]) == 0  # fmt: skip
    sft = tcsm.from_pretrained(tmp_path / "sft")
    assert not torch.equal(sft(x), imported(x))  # the adapters moved
    # reward (its eval split is the SFT data's empty test split: the bound of prompted records is SFT's own metric)
    assert main(["finetune", "reward", "--from", str(tmp_path / "sft"), "--reward", "vader", "-B", "2", "--steps", "2",
                 "--eval-samples", "2", "-o", str(tmp_path / "rw"), *COMMON, "eval.split=test"]) == 0  # fmt: skip
    # export: a LoRA run must choose; merged, the directory is the model's own again
    capsys.readouterr()
    assert main(["export", str(tmp_path / "rw"), "-o", str(tmp_path / "out")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--merge-lora" in err[0] and "--lora-adapter" in err[0]
    assert main(["export", str(tmp_path / "rw"), "-o", str(tmp_path / "out"), "--merge-lora"]) == 0
    out = tmp_path / "out"
    assert (out / "modeling_tiny_dlm.py").read_text() == (d / "modeling_tiny_dlm.py").read_text()
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"] == json.loads((d / "config.json").read_text())["auto_map"] and config["mask_token_id"] == 15
    reloaded = tf.AutoModel.from_pretrained(str(out), trust_remote_code=True).eval()
    assert type(reloaded).__name__ == "TinyDLMModel"
    tuned = tcsm.from_pretrained(tmp_path / "rw")
    with torch.no_grad():
        theirs = reloaded(input_ids=tuned.input_ids(x)).logits[..., :15]
        torch.testing.assert_close(tuned(x)[..., :15], theirs, atol=1e-5, rtol=0)
    # generate with tcsm's samplers, from the export
    capsys.readouterr()
    assert main(["sample", str(out), "-n", "2", "--steps", "4", "--no-progress", "--seed", "1"]) == 0
    text = capsys.readouterr().out
    assert text.strip() and "<|mdm_mask|>" not in text  # the mask token is never a clean value
