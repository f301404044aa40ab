"""A LLaDA-style masked diffusion LM directory (its own modeling code, written by the test) goes the whole way with the
CLI: imported as it is (train.steps=0) → its masked bound (tcsm eval) → SFT with LoRA → reward fine-tuning with the
reference shared as the adapters-off model → export (merged) → reloaded by its own class through
`AutoModel.from_pretrained(DIR, trust_remote_code=True)`, logits equal to tcsm's → decoded with tcsm's samplers."""

from __future__ import annotations

import builtins
import json
import shlex

import pytest
import torch
from llada_helpers import WORDS, write_masked_dlm
from omegaconf import OmegaConf
from train_helpers import ROOT, restore_torch_threads, tiny  # noqa: F401

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


def _docs_commands() -> list[list[str]]:
    """The bash block of docs/huggingface.md's masked-family section, one argv per `tcsm` line."""
    text = (ROOT / "docs" / "huggingface.md").read_text(encoding="utf-8")
    section = text[text.index("## Masked diffusion LMs") :]
    block = section[section.index("```bash") + 7 : section.index("```", section.index("```bash") + 7)]
    return [shlex.split(line)[1:] for line in block.strip().splitlines() if line.startswith("tcsm ")]


#: what makes each documented command tiny (appended: the documented keys stay as written)
SHRINK = {"train": [o for o in tiny(synthetic=False) if not o.startswith(("model.", "data."))],
          "finetune": COMMON + ["--steps", "3", "optim.lr=3e-2"], "sample": ["--no-progress"]}  # fmt: skip


def test_a_llada_directory_goes_load_bound_sft_lora_reward_export_reload_generate(tmp_path, monkeypatch, capsys):
    """docs/huggingface.md's commands as they are, then what each step must have done."""
    from tcsm.builders.assemble import build_components
    from tcsm.builders.config import load_config
    from tcsm.models.lora import AdaptersOff

    d = write_masked_dlm(tmp_path / "llada")
    (tmp_path / "corpus.txt").write_text("\n".join(" ".join(WORDS[i % 7 : i % 7 + 6]) for i in range(60)))
    recs = [{"prompt": "the quick", "completion": "brown fox jumps"}, {"prompt": "a cat", "completion": "sat on mat"}] * 8
    (tmp_path / "recs.jsonl").write_text("\n".join(json.dumps(r) for r in recs))
    monkeypatch.chdir(tmp_path)
    commands = _docs_commands()
    assert [c[0] for c in commands] == ["prepare", "train", "eval", "finetune", "finetune", "export", "sample"]
    for argv in commands:
        extra = SHRINK.get(argv[0], [])
        if argv[0] == "eval":
            extra = ["--json"]
        capsys.readouterr()
        assert main([*argv, *extra]) == 0, capsys.readouterr().err
        if argv[0] == "eval":
            bound = json.loads(capsys.readouterr().out)
    # load: the run holds the directory's model as it is
    imported = tcsm.from_pretrained(tmp_path / "runs/llada")
    own = tf.AutoModel.from_pretrained(str(d), trust_remote_code=True).eval()
    x = torch.randint(0, 17, (3, 12))
    with torch.no_grad():
        assert torch.equal(imported(x)[..., :15], own(input_ids=imported.input_ids(x)).logits[..., :15])
    # bound
    assert bound["bound"].startswith("masked") and bound["nats_per_token"] > 0 and bound["nats_per_token_stderr"] > 0
    # SFT with LoRA moved the adapters only
    sft = tcsm.from_pretrained(tmp_path / "runs/llada-sft")
    assert not torch.equal(sft(x), imported(x))
    # reward: its reference is the model with its adapters disabled, no second copy of the weights
    saved = OmegaConf.to_container(OmegaConf.load(tmp_path / "runs/llada-rw/config.yaml"))
    parts = build_components(load_config(base=saved), torch.device("cpu"))
    assert isinstance(parts.reference, AdaptersOff) and parts.reference.module is parts.model
    assert not list(parts.reference.parameters())
    # export: a LoRA run must choose (one line); merged, the directory is the model's own again
    capsys.readouterr()
    assert main(["export", "runs/llada-rw", "-o", str(tmp_path / "other")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--merge-lora" in err[0] and "--lora-adapter" in err[0]
    out = tmp_path / "llada-out"
    assert (out / "modeling_tiny_dlm.py").read_text() == (d / "modeling_tiny_dlm.py").read_text()
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"] == json.loads((d / "config.json").read_text())["auto_map"] and config["mask_token_id"] == 15
    reloaded = tf.AutoModel.from_pretrained(str(out), trust_remote_code=True).eval()
    assert type(reloaded).__name__ == "TinyDLMModel"
    tuned = tcsm.from_pretrained(tmp_path / "runs/llada-rw")
    with torch.no_grad():
        theirs = reloaded(input_ids=tuned.input_ids(x)).logits[..., :15]
        torch.testing.assert_close(tuned(x)[..., :15], theirs, atol=1e-5, rtol=0)
    # generate with tcsm's samplers, from the export (the last documented line)
    capsys.readouterr()
    assert main(["sample", str(out), "-n", "2", "--steps", "4", "--no-progress", "--seed", "1"]) == 0
    text = capsys.readouterr().out
    assert text.strip() and "<|mdm_mask|>" not in text  # the mask token is never a clean value


def test_a_lora_adapter_export_loads_onto_the_directorys_own_model(tmp_path, capsys):
    """A LoRA run started from the directory itself exports PEFT's adapter directory, which
    `PeftModel.from_pretrained(AutoModel.from_pretrained(DIR, trust_remote_code=True), OUT)` loads: tcsm's logits."""
    from peft import PeftModel

    d = write_masked_dlm(tmp_path / "llada")
    args = [o for o in tiny("data.seq_len=12", "data.vocab_size=16", "train.steps=2", "train.eval_every=0",
                            "train.sample_every=0", "optim.lr=3e-2") if not o.startswith("model.")]  # fmt: skip
    args += ["model.name=hf_masked_dlm", f"model.name_or_path={d}", "model.trust_remote_code=true",
             "train.lora.r=2", "train.lora.target_modules=[q_proj,ff_out]", "train.lora.merge=false"]  # fmt: skip
    assert main(["train", "-o", str(tmp_path / "run"), *args]) == 0
    assert main(["export", str(tmp_path / "run"), "-o", str(tmp_path / "adapter")]) == 0  # train.lora.merge chose
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"] == str(d)
    ours = tcsm.from_pretrained(tmp_path / "run")
    theirs = PeftModel.from_pretrained(tf.AutoModel.from_pretrained(str(d), trust_remote_code=True),
                                       str(tmp_path / "adapter")).eval()  # fmt: skip
    x = torch.randint(0, 17, (3, 12))
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[..., :15], theirs(input_ids=ours.input_ids(x)).logits[..., :15],
                                   atol=1e-6, rtol=0)  # fmt: skip
        base = tf.AutoModel.from_pretrained(str(d), trust_remote_code=True).eval()
        assert not torch.allclose(ours(x)[..., :15], base(input_ids=ours.input_ids(x)).logits[..., :15])


def test_preference_dre_and_distillation_take_the_masked_family_with_lora(tmp_path, monkeypatch, capsys):
    """The other recipes through the same contract: `tcsm pairs` + `tcsm finetune preference` and `tcsm finetune dre`
    (strategy i) from the imported directory with LoRA, each reading its reference as the adapters-off model, and
    `tcsm distill` of a causal LM of the same tokenizer into the directory's model with LoRA."""
    from tcsm.builders.assemble import build_components
    from tcsm.builders.config import load_config
    from tcsm.models.lora import AdaptersOff

    d = write_masked_dlm(tmp_path / "llada")
    (tmp_path / "corpus.txt").write_text("\n".join(" ".join(WORDS[i % 7 : i % 7 + 6]) for i in range(60)))
    monkeypatch.chdir(tmp_path)
    prepare, train = _docs_commands()[:2]
    shrink = SHRINK["train"]
    assert main([*prepare]) == 0 and main([*train, *shrink]) == 0
    lora = ["train.lora.r=2", "train.lora.target_modules=[q_proj,v_proj]", "optim.lr=3e-2", *COMMON]
    steps = ["--steps", "2"]
    assert main(["pairs", "--from", "runs/llada", "--reward", "vader", "-n", "8", "--group", "2", "--steps", "4",
                 "-o", "pairs.jsonl", "--prompt", "the"]) == 0  # fmt: skip
    assert main(["finetune", "preference", "--from", "runs/llada", "--pairs", "pairs.jsonl", "-o", "runs/pref",
                 *steps, "--eval-samples", "0", *lora]) == 0  # fmt: skip
    assert main(["finetune", "dre", "--from", "runs/llada", "--strategy", "i", "--loss", "bce", "-o", "runs/dre",
                 *steps, "--eval-examples", "4", *lora]) == 0  # fmt: skip
    x = torch.randint(0, 17, (3, 12))
    start = tcsm.from_pretrained("runs/llada")
    for run in ("runs/pref", "runs/dre"):
        assert not torch.equal(tcsm.from_pretrained(run)(x), start(x)), run
        saved = OmegaConf.to_container(OmegaConf.load(tmp_path / run / "config.yaml"))
        parts = build_components(load_config(base=saved), torch.device("cpu"))
        assert isinstance(parts.reference, AdaptersOff) and parts.reference.module is parts.model, run
    # distillation: an AR teacher trained on the same shards (the same tokenizer) teaches the directory's model
    ar = [o for o in tiny(synthetic=False) if not o.startswith(("model.", "data."))]
    assert main(["train", "-c", "causal-lm", "-o", "runs/ar", "data.kind=shards", "data.path=shards",
                 "data.seq_len=12", "model.max_len=12", "model.preset=tiny", *ar, "train.steps=1"]) == 0  # fmt: skip
    student = ["model.name=hf_masked_dlm", f"model.name_or_path={d}", "model.trust_remote_code=true"]
    assert main(["distill", "--teacher", "runs/ar", "-o", "runs/student", *steps, "--eval-samples", "2",
                 "--eval-steps", "2", *student, *lora]) == 0  # fmt: skip
    assert not torch.equal(tcsm.from_pretrained("runs/student")(x), start(x))
