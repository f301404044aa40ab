"""`tcsm sample` end to end on a tiny character-level checkpoint trained here, and its error cases."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tcsm.cli import main
from tcsm.cli.sample import first_generated, generation_length, template_positions

CORPUS = "the cat sat on the mat and the dog ate a hat. " * 60


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A 3-step masked-diffusion run on a character corpus (vocabulary ' .acdeghmnost')."""
    from tcsm.builders.config import load_config
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
    Trainer.from_config(cfg, root / "run", log=lambda s: None).fit()
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


def test_max_new_tokens_follow_each_prompt(run_dir, capsys, tmp_path):
    dest = tmp_path / "s.jsonl"
    code, _, err = _sample(capsys, run_dir, "-n", 1, "--steps", 4, "--prompt", "the dog", "--prompt", "a",
                           "--max-new-tokens", 5, "-o", dest)  # fmt: skip
    assert code == 0, err
    rows = [json.loads(line) for line in dest.read_text().splitlines()]
    assert [len(r["tokens"]) for r in rows] == [12, 6] and [r["length"] for r in rows] == [12, 6]
    assert rows[0]["text"].startswith("the dog") and "lengths 6-12" in err
    assert generation_length(7, 5, None) == 12 and generation_length(7, 5, 4) == 12 and generation_length(7, 6, 4) == 16
    assert first_generated([3, 0, 3, 3], [True, False, False, False], 3) == 2
    assert first_generated([3, 0, 1], None, 3) == 0 and first_generated([1], None, None) is None


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
        (["--steps", "0"], "sample.steps must be >= 1"),
        (["--steps", "ten"], "expected an integer"),
        (["--top-p", "1.5"], "top_p must be in (0, 1]"),
        (["--temperature", "0"], "temperature must be > 0"),
        (["--method", "gibbs"], "invalid choice"),
        (["--prompt", "the cat sat on the mat and the dog"], "tokens long"),
        (["--prompt", "XYZ"], "outside the"),
        (["--length", "999"], "maximum length"),
        (["--infill", "a_", "--prompt", "a"], "not several"),
        (["--eos", "99"], "not a token id"),
        (["--eos", "-1"], "token id >= 0 or"),
        (["--max-new-tokens", "4", "--length", "8"], "without --length"),
        (["--max-new-tokens", "40"], "maximum length 32"),
    ],
)
def test_bad_arguments_exit_non_zero_with_one_line(run_dir, capsys, argv, message):
    code, err = None, ""
    try:
        code, _, err = _sample(capsys, run_dir, *argv)
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

    # tcsm's denoiser offers "positions": called only in the steps that reveal something, so at most L = 24 calls,
    # with or without MDLM's cache (MATH.md §6.2), which it does not need
    cached, uncached = calls(), calls("--no-cache")
    assert cached == uncached <= 24


# --- tcsm eval --genppl / --zeroshot -------------------------------------------------------------------

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
BPE = DATA / "gpt2_bpe"
needs_bpe = pytest.mark.skipif(not (BPE / "encoder.json").is_file(), reason="GPT-2 BPE files not present")


def _eval_json(capsys, *argv):
    code = main(["eval", *map(str, argv), "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


@pytest.fixture(scope="module")
def hf_reference(tmp_path_factory):
    """A tiny random Hugging Face GPT-2 with the real GPT-2 tokenizer, saved to a directory."""
    transformers = pytest.importorskip("transformers")
    if not (BPE / "encoder.json").is_file():
        pytest.skip("GPT-2 BPE files not present")
    from tcsm.data import gpt2_tokenizer

    d = tmp_path_factory.mktemp("hf_ref")
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=gpt2_tokenizer(str(BPE)).hf._tokenizer, eos_token="<|endoftext|>", bos_token="<|endoftext|>"
    )
    tok.save_pretrained(d)
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=50257, n_positions=64, n_embd=16, n_layer=1, n_head=2)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(d)
    return d


def test_eval_genppl_curve_and_samples_file(run_dir, hf_reference, capsys, tmp_path):
    from tcsm.evaluation import ScorerLM, generative_perplexity

    png = tmp_path / "curve.png"
    res = _eval_json(capsys, run_dir, "--genppl", "--reference", hf_reference, "--steps", "4,16",
                     "--num-samples", 3, "--batch-size", 2, "--plot", png, "--output", tmp_path / "r.json")
    assert [r["steps"] for r in res["genppl"]] == [4, 16]
    assert all(r["gen_ppl"] > 1 and r["entropy_mean"] > 0 and r["num_samples"] == 3 for r in res["genppl"])
    assert png.stat().st_size > 1000 and json.loads((tmp_path / "r.json").read_text())["genppl"]
    # Scoring a `tcsm sample` jsonl file gives the library's number for the same texts.
    samples = tmp_path / "s.jsonl"
    assert main(["sample", str(run_dir), "-n", "3", "--steps", "8", "-o", str(samples), "--no-progress"]) == 0
    res = _eval_json(capsys, run_dir, "--genppl", "--reference", hf_reference, "--samples", samples)
    texts = [json.loads(line)["text"] for line in samples.read_text().splitlines()]
    direct = generative_perplexity(ScorerLM.from_pretrained(hf_reference), texts=texts)
    assert res["genppl"][0]["gen_ppl"] == pytest.approx(direct.gen_ppl, rel=1e-6)


def test_eval_genppl_with_a_tcsm_causal_reference(run_dir, capsys, tmp_path):
    from tcsm.builders.config import load_config, to_dict
    from tcsm.builders.loading import load_checkpoint
    from tcsm.storage.checkpoint import save_checkpoint

    own = load_checkpoint(run_dir)
    cfg = load_config(base={**to_dict(own.config), "model": {"name": "causal", "preset": "small", "d_model": 16,
                                                             "n_layers": 1, "n_heads": 2, "max_len": 32}})
    from tcsm.builders.components import build_model_for_checkpoint

    causal = build_model_for_checkpoint(cfg, own.data_info, "cpu")
    save_checkpoint(tmp_path / "ref" / "checkpoints", 1, model=causal,
                    state={"config": to_dict(cfg), "data_info": own.data_info})
    res = _eval_json(capsys, run_dir, "--genppl", "--reference", tmp_path / "ref", "--num-samples", 2,
                     "--steps", 8)
    # The causal model's zero-initialised head is uniform over V, so every scored token costs log V.
    V = own.data_info["vocab_size"]
    assert res["genppl"][0]["gen_ppl"] == pytest.approx(V, rel=1e-4)
    assert res["genppl"][0]["num_tokens"] == 2 * 24


def test_speculative_drafter_from_a_run_or_an_exported_hf_directory(run_dir, capsys, tmp_path):
    """`tcsm sample` and `tcsm eval --genppl` load `--drafter` from a run directory and from its `tcsm export`
    (Hugging Face) directory, and refuse a directory that holds neither in one line."""
    from tcsm.builders.components import build_model_for_checkpoint
    from tcsm.builders.config import load_config, to_dict
    from tcsm.builders.loading import load_checkpoint
    from tcsm.storage.checkpoint import save_checkpoint

    hf = tmp_path / "hf"
    assert main(["export", str(run_dir), "-o", str(hf)]) == 0
    assert (hf / "config.json").is_file()
    capsys.readouterr()
    outs = []
    for drafter in (run_dir, hf):
        code, out, err = _sample(capsys, run_dir, "-n", 3, "--method", "speculative", "--drafter", drafter,
                                 "--draft-length", 3, "--seed", 2)
        assert code == 0, err
        assert "drafts accepted" in err and "sequential model passes" in err
        outs.append(out)
    assert outs[0] == outs[1]  # the same weights (EMA) drive the same draws
    own = load_checkpoint(run_dir)
    cfg = load_config(base={**to_dict(own.config), "model": {"name": "causal", "preset": "small", "d_model": 16,
                                                             "n_layers": 1, "n_heads": 2, "max_len": 32}})
    save_checkpoint(tmp_path / "ref" / "checkpoints", 1, model=build_model_for_checkpoint(cfg, own.data_info, "cpu"),
                    state={"config": to_dict(cfg), "data_info": own.data_info})
    res = _eval_json(capsys, run_dir, "--genppl", "--reference", tmp_path / "ref", "--num-samples", 2,
                     "--method", "speculative", "--drafter", hf, "--draft-length", 3)
    row = res["genppl"][0]
    assert row["method"] == "speculative" and 0.0 <= row["acceptance"] <= 1.0
    assert 1.0 <= row["sequential_passes_per_sequence"] <= 24
    (tmp_path / "neither").mkdir()
    code, _, err = _sample(capsys, run_dir, "-n", 1, "--method", "speculative", "--drafter", tmp_path / "neither")
    assert code != 0 and "drafter" in err and len(err.strip().splitlines()) == 1


def test_speculative_ngram_drafter_counted_for_the_run(run_dir, capsys, tmp_path):
    """`sample.drafter=ngram` counts an n-gram for the run: on its training split, or on seeded draws of an AR run
    (the same drafter, so the same samples, each time); draws of a diffusion run are refused in one line."""
    from tcsm.builders.components import build_model_for_checkpoint
    from tcsm.builders.config import load_config, to_dict
    from tcsm.builders.loading import load_checkpoint
    from tcsm.storage.checkpoint import save_checkpoint

    code, _, err = _sample(capsys, run_dir, "-n", 2, "--method", "speculative", "--drafter", "ngram",
                           "sample.ngram_order=2", "sample.reveal_order=left_to_right", "--draft-length", 3)  # fmt: skip
    assert code == 0, err
    assert "drafts accepted" in err
    code, _, err = _sample(capsys, run_dir, "-n", 1, "--method", "speculative", "--drafter", "ngram",
                           "sample.ngram_draws=8")  # fmt: skip
    assert code != 0 and "ngram_draws" in err and len(err.strip().splitlines()) == 1
    own = load_checkpoint(run_dir)
    cfg = load_config(base={**to_dict(own.config), "model": {"name": "causal", "preset": "small", "d_model": 16,
                                                             "n_layers": 1, "n_heads": 2, "max_len": 32}})
    save_checkpoint(tmp_path / "ar" / "checkpoints", 1, model=build_model_for_checkpoint(cfg, own.data_info, "cpu"),
                    state={"config": to_dict(cfg), "data_info": own.data_info})
    outs = []
    for _ in range(2):
        code, out, err = _sample(capsys, tmp_path / "ar", "-n", 2, "--method", "speculative", "--drafter", "ngram",
                                 "sample.ngram_draws=16", "sample.ngram_order=3", "--seed", 5)  # fmt: skip
        assert code == 0, err
        assert "drafts accepted" in err
        outs.append(out)
    assert outs[0] == outs[1] and outs[0].strip()
    res = _eval_json(capsys, tmp_path / "ar", "--genppl", "--reference", tmp_path / "ar", "--num-samples", 2,
                     "--method", "speculative", "--drafter", "ngram", "--draft-length", 3)  # fmt: skip
    assert res["genppl"][0]["method"] == "speculative" and 0.0 <= res["genppl"][0]["acceptance"] <= 1.0


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory):
    """One training step of a tiny GPT-2-BPE denoiser (V = 50,257)."""
    if not (BPE / "encoder.json").is_file():
        pytest.skip("GPT-2 BPE files not present")
    from tcsm.builders.config import load_config
    from tcsm.train.trainer import Trainer

    root = tmp_path_factory.mktemp("bpe_run")
    (root / "corpus.txt").write_text("The quick brown fox jumps over the lazy dog. " * 200)
    cfg = load_config(base={
        "data": {"kind": "bpe", "path": str(root / "corpus.txt"), "bpe_dir": str(BPE), "seq_len": 32,
                 "valid_frac": 0.1, "test_frac": 0.1},
        "model": {"preset": "tiny", "d_model": 16, "n_layers": 1, "n_heads": 2, "cond_dim": 8, "max_len": 32},
        "train": {"steps": 1, "batch_size": 2, "device": "cpu", "ema": 0, "eval_every": 0, "eval_examples": 2,
                  "sample_every": 0, "save_every": 0, "progress": False, "tensorboard": False},
        "eval": {"batch_size": 2, "num_t": 1},
        "sample": {"num": 0},
    })
    Trainer.from_config(cfg, root / "run", log=lambda s: None).fit()
    return root / "run"


@needs_bpe
def test_eval_zeroshot_on_a_tiny_gpt2_bpe_model(bpe_run, capsys):
    from tcsm.data import gpt2_tokenizer
    from tcsm.evaluation import prepare_zeroshot

    res = _eval_json(capsys, bpe_run, "--zeroshot", "ptb,lambada", "--data-root", DATA, "--max-documents", 8,
                     "--num-t", 1, "--batch-size", 4)
    tok = gpt2_tokenizer(str(BPE))
    for name in ("ptb", "lambada"):
        r = res["zeroshot"][name]
        expected = prepare_zeroshot(name, tok, block_size=32, eos_id=50256, data_root=DATA, max_documents=8)
        assert r["num_blocks"] == expected.blocks.shape[0] and r["protocol"]["layout"] == "sedd"
        # An almost untrained model: the bound is near log V per token, far above any real model.
        assert 1e3 < r["ppl_bound"] < 1e7
    assert "LAMBADA" in res["zeroshot"]["lambada"]["label"]


def test_eval_zeroshot_refuses_a_non_bpe_model_in_one_line(run_dir, capsys):
    assert main(["eval", str(run_dir), "--zeroshot", "ptb"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "GPT-2-BPE" in err[0]
    assert main(["eval", str(run_dir), "--zeroshot", "enwik8"]) == 2
    assert "unknown zero-shot set" in capsys.readouterr().err


@pytest.fixture(scope="module")
def block_run(tmp_path_factory):
    """The same tiny run as a block model (path.block_length=4): decoded block by block with its KV cache."""
    from tcsm.builders.config import load_config
    from tcsm.train.trainer import Trainer

    root = tmp_path_factory.mktemp("sample_blocks")
    (root / "corpus.txt").write_text(CORPUS)
    cfg = load_config(base={
        "data": {"kind": "text", "path": str(root / "corpus.txt"), "seq_len": 24, "valid_frac": 0.1,
                 "test_frac": 0.1},
        "path": {"block_length": 4},
        "model": {"preset": "tiny", "d_model": 32, "n_layers": 1, "n_heads": 2, "cond_dim": 16, "max_len": 32},
        "train": {"steps": 3, "batch_size": 4, "device": "cpu", "ema": 0.9, "eval_every": 0, "eval_examples": 4,
                  "sample_every": 0, "save_every": 0, "progress": False, "tensorboard": False, "log_every": 1},
        "eval": {"batch_size": 4},
        "sample": {"num": 0},
    })  # fmt: skip
    Trainer.from_config(cfg, root / "run", log=lambda s: None).fit()
    return root / "run"


def test_a_block_model_is_decoded_with_its_cache_after_prompts(block_run, capsys, tmp_path):
    dest = tmp_path / "s.jsonl"
    code, _, err = _sample(capsys, block_run, "-n", 2, "--steps", 2, "--method", "margin", "--prompt", "the c",
                           "--prompt", "a", "--max-new-tokens", 6, "--eos", "none", "-o", dest)  # fmt: skip
    assert code == 0, err
    rows = [json.loads(line) for line in dest.read_text().splitlines()]
    # 5 + 6 tokens are drawn as 3 blocks of 4, 1 + 6 as 2, and cut to exactly 6 new tokens
    assert [len(r["tokens"]) for r in rows] == [11, 11, 7, 7] and all(r["block_length"] == 4 for r in rows)
    assert [r["length"] for r in rows] == [11, 11, 7, 7] and len(rows[0]["text"]) == 11
    assert rows[0]["text"].startswith("the c") and rows[3]["text"].startswith("a")
    assert rows[0]["method"] == "blocks+margin" and "2 steps per block of 4, 8 network calls" in err


def test_a_block_model_stops_at_eos(block_run, capsys, tmp_path):
    dest = tmp_path / "s.jsonl"
    code, _, err = _sample(capsys, block_run, "-n", 6, "--steps", 4, "--eos", 0, "-o", dest)  # id 0 is " "
    assert code == 0, err
    rows = [json.loads(line) for line in dest.read_text().splitlines()]
    assert all(" " not in r["text"] and r["eos_id"] == 0 for r in rows)
    cut = [r for r in rows if len(r["tokens"]) < 24]
    assert cut and all(r["tokens"][-1] == 0 and len(r["text"]) == len(r["tokens"]) - 1 for r in cut)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--semi-ar-block", "2"], "holds a block model"),
        (["--steps", "5", "--method", "margin"], "steps per block"),
        (["--method", "joint"], "draws whole sequences"),
        (["--length", "10"], "multiple of the model's block length 4"),
        (["--eos", "99"], "not a token id"),
    ],
)
def test_a_block_model_refuses_what_does_not_fit_in_one_line(block_run, capsys, argv, message):
    code, _, err = _sample(capsys, block_run, *argv)
    lines = err.strip().splitlines()
    assert code != 0 and len(lines) == 1 and message in lines[0], err


def test_the_old_name_of_semi_ar_block_is_read_with_a_note(block_run, capsys):
    code, _, err = _sample(capsys, block_run, "sample.block_length=2")
    lines = err.strip().splitlines()
    assert code != 0 and "sample.block_length is now sample.semi_ar_block" in lines[0], err
    assert len(lines) == 2 and "--semi-ar-block decodes a full-sequence model" in lines[1], err


def test_an_output_file_tcsm_did_not_write_is_kept(run_dir, capsys, tmp_path):
    book = tmp_path / "book.txt"
    book.write_text("chapter one\n" * 5000)
    code, _, err = _sample(capsys, run_dir, "-n", 1, "--steps", 2, "-o", book)
    assert code != 0 and "--overwrite" in err and len(err.strip().splitlines()) == 1
    assert book.read_text() == "chapter one\n" * 5000
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    code = main(["eval", str(run_dir), "--output", str(notes), "--num-t", "1", "--max-examples", "2"])
    err = capsys.readouterr().err
    assert code != 0 and "--overwrite" in err and notes.read_text() == "my notes\n"
    code, _, err = _sample(capsys, run_dir, "-n", 1, "--steps", 2, "-o", book, "--overwrite")
    assert code == 0, err
    assert len(book.read_text().splitlines()) == 1


def test_an_output_file_tcsm_wrote_is_replaced_in_one_line(run_dir, capsys, tmp_path):
    dest = tmp_path / "s.jsonl"
    for n in (2, 1):
        code, _, err = _sample(capsys, run_dir, "-n", n, "--steps", 2, "-o", dest)
        assert code == 0, err
    assert "replacing" in err and "samples tcsm wrote" in err
    assert len(dest.read_text().splitlines()) == 1
    report = tmp_path / "r.json"
    for _ in range(2):
        code = main(["eval", str(run_dir), "--output", str(report), "--num-t", "1", "--max-examples", "2"])
        err = capsys.readouterr().err
        assert code == 0, err
    assert "an eval report tcsm wrote" in err and json.loads(report.read_text())["step"] == 3


def test_max_new_tokens_reach_past_the_training_length_up_to_the_model_positions(block_run, capsys, tmp_path):
    dest = tmp_path / "s.jsonl"  # trained on 24 tokens, the model has 32 positions
    code, _, err = _sample(capsys, block_run, "-n", 1, "--steps", 1, "--prompt", "the c", "--max-new-tokens", 22,
                           "--eos", "none", "-o", dest)  # fmt: skip
    assert code == 0, err
    assert [len(json.loads(line)["tokens"]) for line in dest.read_text().splitlines()] == [27]


def test_eos_ends_a_full_sequence_sample(run_dir, capsys, tmp_path):
    dest = tmp_path / "s.jsonl"
    code, _, err = _sample(capsys, run_dir, "-n", 6, "--steps", 4, "--eos", 0, "-o", dest)  # id 0 is " "
    assert code == 0, err
    rows = [json.loads(line) for line in dest.read_text().splitlines()]
    assert all(" " not in r["text"] and r["eos_id"] == 0 for r in rows)
    assert any(len(r["tokens"]) < 24 and r["tokens"][-1] == 0 for r in rows)


@pytest.fixture(scope="module")
def task_run(tmp_path_factory):
    """A 1-step run on the addition task, whose rows end with its end-of-sequence character."""
    from train_helpers import tiny

    root = tmp_path_factory.mktemp("sample_task")
    argv = [o for o in tiny("data.kind=task", "data.task=addition", "data.options.digits=2", "data.num_train=32",
                            "data.num_valid=4", "data.num_test=4", "train.steps=1", "train.eval_every=0",
                            "train.sample_every=0", "sample.num=0", synthetic=False) if not o.startswith("data.seq_len")]
    assert main(["train", "-o", str(root / "add"), *argv]) == 0
    return root / "add"


def test_a_task_run_stops_at_its_data_end_of_sequence_by_default(task_run, capsys, tmp_path):
    from tcsm.data.tasks.base import EOS

    dest = tmp_path / "s.jsonl"
    code, _, err = _sample(capsys, task_run, "-n", 16, "--steps", 2, "--prompt", "12+34=", "-o", dest)
    assert code == 0, err
    rows = [json.loads(line) for line in dest.read_text().splitlines()]
    eos = rows[0]["eos_id"]
    assert eos is not None and all(EOS not in r["text"] for r in rows)
    assert all(eos not in r["tokens"][:-1] for r in rows)


def test_overrides_of_the_sample_section_act_as_the_flags_do(run_dir, capsys, tmp_path):
    by_flag, by_key = tmp_path / "flag.jsonl", tmp_path / "key.jsonl"
    assert _sample(capsys, run_dir, "-n", 2, "--steps", 4, "--temperature", 0.9, "-o", by_flag)[0] == 0
    code, _, err = _sample(capsys, run_dir, "sample.temperature=0.9", "sample.steps=4", "-n", 2, "-o", by_key)
    assert code == 0, err
    rows = [json.loads(line) for line in by_key.read_text().splitlines()]
    assert rows[0]["temperature"] == 0.9 and rows[0]["steps"] == 4
    assert [r["tokens"] for r in rows] == [json.loads(line)["tokens"] for line in by_flag.read_text().splitlines()]


def test_print_config_shows_the_section_the_draw_uses(run_dir, capsys):
    code, out, _ = _sample(capsys, run_dir, "--steps", 7, "sample.top_p=0.5", "--print-config")
    assert code == 0 and "sample:" in out and "steps: 7" in out and "top_p: 0.5" in out


@pytest.mark.parametrize("argv, message", [
    (["train.steps=3"], "overrides of the sample: section"),
    (["sample.nope=1"], "not a sampler setting"),
    (["sample.temperature=0"], "temperature must be > 0"),
    (["--sir-k", "3"], "sir sampler"),
    (["--method", "joint", "--temperature", "0.5"], "not a setting of the joint sampler"),
])  # fmt: skip
def test_keys_no_sampler_of_the_run_reads_are_refused_in_one_line(run_dir, capsys, argv, message):
    code, _, err = _sample(capsys, run_dir, *argv)
    lines = err.strip().splitlines()
    assert code != 0 and len(lines) == 1 and message in lines[0], err


def test_the_command_writes_at_most_twelve_flags_by_hand():
    """The sampler settings' flags come from the `sample:` schema (cli/fields.py); cli/sample.py adds by hand only
    what is the command's own (the run, prompts, output): at most 12 `add_argument` calls."""
    import ast

    import tcsm.cli.sample as sample_cli

    tree = ast.parse(Path(sample_cli.__file__).read_text(encoding="utf-8"))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "add_argument"]
    assert 1 <= len(calls) <= 12, f"{len(calls)} hand-written add_argument calls in cli/sample.py"
