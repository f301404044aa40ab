"""TCSM post-training of a DiffusionGemma model through the same commands as tcsm's own models, on a tiny random
instance pre-trained for two steps on a character corpus: `tcsm finetune sft` with the reference recipe (its routers
stay as they were), `tcsm finetune reward` with on-policy x_t (drawn block by block through the model's cache),
`tcsm pairs` + `tcsm finetune preference`, `tcsm finetune dre` and `tcsm distill` from a causal LM of the same
tokenizer with the student's own samples as the proposal."""

from __future__ import annotations

import json

import pytest
import torch
from diffusion_gemma_helpers import tiny_hf
from train_helpers import final_weights, restore_torch_threads  # noqa: F401

from tcsm.cli import main
from tcsm.data.prepare import prepare

tf = pytest.importorskip("transformers")
if not hasattr(tf, "DiffusionGemmaForBlockDiffusion"):
    pytest.skip("this transformers has no DiffusionGemma", allow_module_level=True)

pytestmark = pytest.mark.usefixtures("one_thread")

K = 4
WORDS = ["good", "bad", "happy", "sad", "the", "day", "was", "a"]
DOCS = [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(6 + i % 5)) + "." for i in range(80)]
COMMON = ["train.device=cpu", "train.threads=1", "train.progress=false", "train.tensorboard=false",
          "train.precision=fp32", "train.eval_every=0", "train.sample_every=0", "sample.num=0", "train.batch_size=4",
          "sample.steps=2", "train.eval_examples=8"]  # fmt: skip


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """Character shards, a tiny DiffusionGemma directory of their vocabulary and a 2-step `tcsm train` run of it."""
    root = tmp_path_factory.mktemp("dgpost")
    (root / "c.txt").write_text("\n".join(DOCS), encoding="utf-8")
    prepare([str(root / "c.txt")], root / "shards", "char", doc_separator="\n", progress=False, valid_fraction=0.2,
            test_fraction=0)  # fmt: skip
    V = json.loads((root / "shards" / "index.json").read_text())["vocab_size"]
    tiny_hf(V=V, k=K, window=3).save_pretrained(root / "model")
    argv = ["train", "-o", root / "run", "data.kind=shards", f"data.path={root / 'shards'}", "data.seq_len=12",
            "data.windows=random", "path.source=uniform", f"path.block_length={K}", "model.name=diffusion_gemma",
            f"model.name_or_path={root / 'model'}", "train.steps=2", *COMMON]  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        assert main([str(a) for a in argv]) == 0
    return root


def _main(*argv) -> int:
    return main([str(a) for a in argv])


def test_sft_with_the_reference_recipe_keeps_the_routers(root, tmp_path):
    recs = [{"prompt": "good", "completion": " day."}, {"prompt": "the", "completion": " sad day"}] * 8
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert _main("finetune", "sft", "--from", root / "run", "--data", tmp_path / "sft.jsonl", "--steps", "2",
                 "-o", tmp_path / "sft", "objective.recipe=reference", "objective.self_cond_prob=1",
                 "objective.eval_num_t=2", "data.valid_frac=0.25", "optim.lr=1e-2", "eval.t_max=0.9",
                 *COMMON) == 0  # fmt: skip
    rows = [json.loads(r) for r in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    assert train and all({"ce", "ar"} <= set(r) for r in train)
    summary = json.loads((tmp_path / "sft" / "summary.json").read_text())
    assert summary["bound"] == "reversal@t_max=0.9, completion | prompt" and summary["nats_per_token"] > 0
    before, after = final_weights(root / "run", "ema"), final_weights(tmp_path / "sft")
    routers = [k for k in before if ".router." in k]
    assert routers and all(torch.equal(before[k], after[k]) for k in routers)
    assert any(not torch.equal(before[k], after[k]) for k in before if ".experts." in k)


def test_reward_with_on_policy_states_drawn_through_the_block_cache(root, tmp_path):
    assert _main("finetune", "reward", "--from", root / "run", "--reward", "vader", "-B", "2", "--xt-source", "model",
                 "--steps", "2", "--eval-samples", "2", "-o", tmp_path / "rw", *COMMON) == 0  # fmt: skip
    report = json.loads((tmp_path / "rw" / "reward_eval.json").read_text())
    assert report["num_samples"] == 2
    before, after = final_weights(root / "run", "ema"), final_weights(tmp_path / "rw")
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_preference_on_the_models_own_pairs(root, tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    assert _main("pairs", "--from", root / "run", "--reward", "vader", "-n", "8", "--group", "3", "--steps", "2",
                 "-o", pairs, "--prompt", "good") == 0  # fmt: skip
    assert _main("finetune", "preference", "--from", root / "run", "--pairs", pairs, "--steps", "2", "--loss", "paper",
                 "-o", tmp_path / "pref", "optim.lr=1e-2", *COMMON) == 0  # fmt: skip
    rows = [json.loads(r) for r in (tmp_path / "pref" / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in rows if r["kind"] == "train" and r["step"] == 1)
    assert first["margin"] == 0  # step 1 is at θ = reference: its log-ratios vanish, so the x1 reached both calls
    assert any(r["kind"] == "train" and r["step"] == 2 and r["margin"] != 0 for r in rows)


def test_dre_and_distillation_from_a_causal_lm_of_the_same_tokenizer(root, tmp_path):
    assert _main("finetune", "dre", "--from", root / "run", "-o", tmp_path / "dre", "--strategy", "i", "--loss", "bce",
                 "--steps", "1", *COMMON) == 0  # fmt: skip
    assert _main("train", "-c", "causal-lm", "-o", tmp_path / "ar", "data.kind=shards",
                 f"data.path={root / 'shards'}", "data.seq_len=12", "data.windows=random", "model.d_model=16",
                 "model.n_layers=1", "model.n_heads=2", "model.max_len=12", "train.steps=1", *COMMON) == 0  # fmt: skip
    assert _main("distill", "--teacher", tmp_path / "ar", "-o", tmp_path / "st", "--steps", "1", "--proposal", "student",
                 "--estimator", "exact", "path.source=uniform", f"path.block_length={K}", "model.name=diffusion_gemma",
                 f"model.name_or_path={root / 'model'}", "target.sample_steps=2", *COMMON) == 0  # fmt: skip
    assert (tmp_path / "st" / "checkpoints" / "latest").is_file()


def test_dre_strategy_ii_sizes_its_ratio_head_from_the_hidden_size(root, tmp_path):
    """Strategy ii (the default) trains a ratio head over the frozen model: a DiffusionGemma has no tcsm trunk, so
    the head takes its width from the model's hidden size; only the head trains."""
    assert _main("finetune", "dre", "--from", root / "run", "-o", tmp_path / "dre", "--bregman", "bce", "--steps", "1",
                 "--eval-examples", "2", *COMMON) == 0  # fmt: skip
    after = final_weights(tmp_path / "dre")
    head = {k: v for k, v in after.items() if k.startswith("head.")}
    assert head["head.embed_clean.weight"].shape[1] == 16  # tiny_hf's hidden_size
    assert json.loads((tmp_path / "dre" / "dre_eval.json").read_text())["reference_bpc"] > 0


def test_the_export_note_of_a_diffusion_gemma_run_asks_for_no_remote_code(root, tmp_path, capsys):
    capsys.readouterr()
    assert _main("export", root / "run", "-o", tmp_path / "hf") == 0
    out = capsys.readouterr().out
    assert "DiffusionGemmaForBlockDiffusion.from_pretrained" in out and "trust_remote_code" not in out


def test_lora_sft_starts_from_the_plain_run(root, tmp_path):
    """A LoRA run takes the plain run's weights as its base: the tied encoder/decoder weights keep one name when
    their layers are adapted (`<layer>.base_layer.weight`), so the start loads."""
    recs = [{"prompt": "good", "completion": " day."}] * 8
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert _main("finetune", "sft", "--from", root / "run", "--data", tmp_path / "sft.jsonl", "--steps", "1",
                 "-o", tmp_path / "lora", "objective.recipe=reference", "objective.eval_num_t=1",
                 "data.valid_frac=0.25", "train.lora.r=2",
                 'train.lora.target_modules=["re:.*(language_model|decoder).*(q_proj|v_proj)"]', *COMMON) == 0  # fmt: skip
    before, after = final_weights(root / "run", "ema"), final_weights(tmp_path / "lora")
    base = {k.replace(".base_layer.", "."): v for k, v in after.items() if "lora_" not in k}
    assert base.keys() == before.keys() and all(torch.equal(base[k], before[k]) for k in before)
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in after.items())


def test_a_diffusion_gemma_directory_goes_load_bound_sft_lora_reward_export_reload_generate(root, tmp_path):
    """The whole way with the CLI: the directory imported as it is (train.steps=0) → its truncated bound (tcsm eval,
    eval.t_max) → SFT with LoRA → reward fine-tuning with LoRA (adapters on tied weights cannot be folded, so it trains
    the SFT adapters further, against the SFT run as its reference) → tcsm export as a PEFT adapter → transformers'
    own class with that adapter gives tcsm's logits and generates; tcsm's cached block sampler decodes the run."""
    from peft import PeftModel

    import tcsm
    from tcsm.builders.assemble import build_components
    from tcsm.builders.loading import load_checkpoint

    lora = ["train.lora.r=2", 'train.lora.target_modules=["re:.*(language_model|decoder).*(q_proj|v_proj)"]']
    model = ["data.kind=shards", f"data.path={root / 'shards'}", "data.seq_len=12", "path.source=uniform",
             f"path.block_length={K}", "model.name=diffusion_gemma", f"model.name_or_path={root / 'model'}"]  # fmt: skip
    assert _main("train", "-o", tmp_path / "import", *model, "train.steps=0", *COMMON) == 0
    assert _main("eval", tmp_path / "import", "--json", "--output", tmp_path / "bound.json", "--max-examples", "4",
                 "--num-t", "2", "eval.t_max=0.9") == 0  # fmt: skip
    bound = json.loads((tmp_path / "bound.json").read_text())
    assert "t_max=0.9" in json.dumps(bound) and 0 < bound["bpc"] < 100
    recs = [{"prompt": "good", "completion": " day."}, {"prompt": "the", "completion": " sad day"}] * 8
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert _main("finetune", "sft", "--from", tmp_path / "import", "--data", tmp_path / "sft.jsonl", "--steps", "2",
                 "-o", tmp_path / "sft", "objective.eval_num_t=1", "data.valid_frac=0.25", "optim.lr=3e-2",
                 "eval.t_max=0.9", *lora, *COMMON) == 0  # fmt: skip
    assert _main("finetune", "reward", "--from", tmp_path / "sft", "--reward", "vader", "-B", "2", "--steps", "2",
                 "--eval-samples", "2", "-o", tmp_path / "rw", "optim.lr=3e-2", "eval.t_max=0.9", *lora,
                 *COMMON) == 0  # fmt: skip
    sft, rw = final_weights(tmp_path / "sft"), final_weights(tmp_path / "rw")
    assert any("lora_B" in k and not torch.equal(sft[k], rw[k]) for k in sft)  # the SFT adapters trained further
    # the reward run's reference is the SFT run (base + its adapters), not the base with adapters disabled
    ck = load_checkpoint(tmp_path / "rw")
    comp = build_components(ck.config, torch.device("cpu"))
    ref_sd = comp.reference.state_dict() if isinstance(comp.reference, torch.nn.Module) else {}
    assert any("lora_B" in k and torch.equal(v, sft[k]) for k, v in ref_sd.items() if k in sft)
    assert _main("export", tmp_path / "rw", "-o", tmp_path / "adapter", "--lora-adapter") == 0
    base = tf.DiffusionGemmaForBlockDiffusion.from_pretrained(root / "model").eval()
    theirs = PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
    ours = tcsm.from_pretrained(tmp_path / "rw")
    V = ours.vocab_size
    g = torch.Generator().manual_seed(0)
    x1, xt = torch.randint(0, V, (2, 12), generator=g), torch.randint(0, V, (2, 12), generator=g)
    with torch.no_grad():
        logits = ours(xt, None, x1=x1)
        own = theirs(input_ids=x1[:, :K], decoder_input_ids=xt[:, K : 2 * K]).logits
        torch.testing.assert_close(own, logits[:, K : 2 * K], atol=1e-5, rtol=0)
        seqs = theirs.generate(x1[:, :K], max_new_tokens=2 * K, max_denoising_steps=2).sequences
    assert seqs.shape == (2, 3 * K)
    assert _main("sample", tmp_path / "rw", "-n", "2", "--steps", "2", "--no-progress") == 0
