"""`tcsm distill` in-process: a tiny end-to-end run with its cost and missed-mass metrics, exact resume (the
n-gram reloaded from the run, not recounted), Hugging Face teachers, and one-line refusals of teachers whose
vocabulary or tokenizer differs from the student's data (saying which) or that would not fit in memory."""

from __future__ import annotations

import json

import pytest
import torch
from train_helpers import assert_same_weights, final_weights, restore_torch_threads, tiny  # noqa: F401

from tcsm.cli import main

STUDENT = ("train.eval_every=0", "train.sample_every=0", "optim.decay=constant", "eval.num_t=2")


def _error(capsys, argv) -> str:
    """Run argv; assert a non-zero exit with exactly one line on stderr and no traceback; return the line."""
    capsys.readouterr()  # drop what earlier steps printed (e.g. progress bars of save_pretrained)
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code != 0 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def _teacher_args(run, *extra) -> list[str]:
    keys = [o for o in tiny("train.eval_every=0", "train.sample_every=0", "train.steps=8") if not o.startswith(("model.cond_dim", "eval.num_t"))]
    return ["train", "-o", str(run), "model.name=causal", "model.preset=tiny", "objective.name=lm", *keys, *extra]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """A tiny causal LM trained on the synthetic source (V = 8, L = 16)."""
    run = tmp_path_factory.mktemp("teacher")
    assert main(_teacher_args(run)) == 0
    return run


def _student(*extra) -> list[str]:
    return [o for o in tiny(*STUDENT, *extra) if not o.startswith("data.")]


def test_distill_end_to_end_reports_cost_and_missed_mass(teacher, tmp_path, capsys):
    run = tmp_path / "s"
    argv = ["distill", "--teacher", str(teacher), "-o", str(run), "--steps", "3", "-k", "2", "--audit-rows", "2"]
    assert main([*argv, *_student(), "--eval-samples", "8", "--eval-steps", "2,4"]) == 0
    out = capsys.readouterr().out
    assert "teacher cost:" in out and "gen-PPL under the teacher" in out and "candidate sets miss" in out
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    V, L = 8, 16
    assert all(1 <= r["target/seq_scores"] <= L * (2 + 2) + 1 < (V - 1) * L + 1 for r in train)
    assert all(0.0 <= r["target/missed_mass"] < 1.0 for r in train)
    assert (run / "ngram.safetensors").is_file()
    report = json.loads((run / "distill_eval.json").read_text())
    assert set(report["steps"]) == {"2", "4"} and report["teacher"]["gen_ppl"] > 1
    cfg = (run / "config.yaml").read_text()
    assert "name: distill" in cfg and "name: denoiser" in cfg  # a diffusion student, not a copy of the teacher


def test_distill_resume_is_exact_and_reuses_the_ngram(teacher, tmp_path, monkeypatch):
    from tcsm.posttrain.distill.ngram import RightContextNgram

    common = ["--teacher", str(teacher), "-k", "2", *_student("train.save_every=2")]
    assert main(["distill", "-o", str(tmp_path / "full"), "--steps", "4", *common]) == 0
    assert main(["distill", "-o", str(tmp_path / "part"), "--steps", "2", *common]) == 0

    def no_counting(*a, **k):
        raise AssertionError("a resumed run must load its stored n-gram")

    monkeypatch.setattr(RightContextNgram, "fit", no_counting)
    assert main(["distill", "--resume", "-o", str(tmp_path / "part"), "--steps", "4"]) == 0
    for which in ("model", "ema"):
        assert_same_weights(final_weights(tmp_path / "full", which), final_weights(tmp_path / "part", which))


def test_distill_from_teacher_samples_only(teacher, tmp_path, capsys):
    run = tmp_path / "nodata"
    args = ["distill", "--teacher", str(teacher), "-o", str(run), "--steps", "2", "--proposal", "teacher"]
    assert main([*args, "--estimator", "topk", *_student()]) == 0
    assert "teacher cost" in capsys.readouterr().out


def test_refuses_a_teacher_with_another_vocabulary_size(teacher, tmp_path, capsys):
    line = _error(capsys, ["distill", "--teacher", str(teacher), "-o", str(tmp_path / "x"), *_student(), "data.vocab_size=5"])
    assert "vocabulary sizes differ" in line and "8-token" in line and "5 tokens" in line
    assert not (tmp_path / "x" / "checkpoints").exists()


def test_refuses_a_teacher_with_other_token_ids(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("abcxcabxbcax" * 400)
    data = [f"data.path={text}", "data.seq_len=16"]
    keys = [o for o in _teacher_args(tmp_path / "char") if not o.startswith("data.")]
    assert main([*keys, "data.kind=text", "data.vocab=xabc", *data]) == 0
    line = _error(capsys, ["distill", "--teacher", str(tmp_path / "char"), "-o", str(tmp_path / "s"), *_student(), "data.vocab=abcx"])
    assert "different token ids" in line and "'a' is 1 in the teacher, 0 in the data" in line


def test_refuses_a_teacher_too_large_for_memory(teacher, tmp_path, capsys):
    line = _error(capsys, ["distill", "--teacher", str(teacher), "-o", str(tmp_path / "x"), *_student(), "target.memory_budget_gb=0.0001"])
    assert "needs about" in line and "GiB" in line and "target.max_tokens" in line
    assert not (tmp_path / "x" / "checkpoints").exists()


def test_teacher_path_and_flag_errors(teacher, tmp_path, capsys):
    assert "give the teacher" in _error(capsys, ["distill", "-o", str(tmp_path / "x")])
    assert "neither a Hugging Face" in _error(capsys, ["distill", "--teacher", str(tmp_path), *_student()])
    assert "must be >= 1" in _error(capsys, ["distill", "--teacher", str(teacher), "-k", "0"])
    assert "cannot change on --resume" in _error(capsys, ["distill", "--resume", "-o", str(tmp_path), "--teacher", str(teacher)])


# --------------------------------------------------------------------------------------------------- Hugging Face


@pytest.fixture(scope="module")
def bpe_corpus(tmp_path_factory):
    from tcsm.data import build_data

    d = tmp_path_factory.mktemp("bpe")
    text = d / "stories.txt"
    text.write_text(" ".join(f"the cat {w} sat on the mat and the dog ran to {w}." for w in ("a", "b", "c", "d") * 60))
    keys = {"kind": "bpe", "path": str(text), "tokenizer": "train", "vocab_size": 300, "seq_len": 16}
    return d, keys, build_data(keys)


def _hf_teacher(directory, tokenizer_json: str, vocab_size: int, eos: int):
    tf = pytest.importorskip("transformers")
    import tokenizers

    torch.manual_seed(0)
    cfg = tf.GPT2Config(vocab_size=vocab_size, n_embd=16, n_layer=1, n_head=2, n_positions=32, bos_token_id=eos, eos_token_id=eos)
    tf.GPT2LMHeadModel(cfg).save_pretrained(directory)
    tok = tf.PreTrainedTokenizerFast(tokenizer_object=tokenizers.Tokenizer.from_str(tokenizer_json))
    tok.save_pretrained(directory)
    return directory


def test_hf_teacher_distills_and_other_merges_are_refused(bpe_corpus, tmp_path, capsys):
    _, keys, data = bpe_corpus
    V = data.vocab_size
    tok_json = data.tokenizer.hf.to_str()
    good = _hf_teacher(tmp_path / "good", tok_json, V, data.eos_id)
    data_args = [f"data.{k}={v}" for k, v in keys.items()]
    run = tmp_path / "s"
    assert main(["distill", "--teacher", str(good), "-o", str(run), "--steps", "2", "-k", "2", *_student(), *data_args]) == 0
    assert "teacher cost" in capsys.readouterr().out
    swapped = json.loads(tok_json)
    merges = swapped["model"]["merges"]
    merges[0], merges[1] = merges[1], merges[0]  # same vocabulary and ids, another tokenizer
    bad = _hf_teacher(tmp_path / "bad", json.dumps(swapped), V, data.eos_id)
    line = _error(capsys, ["distill", "--teacher", str(bad), "-o", str(tmp_path / "b"), *_student(), *data_args])
    assert "different tokenizer files" in line and "merge 0" in line
    line = _error(capsys, ["distill", "--teacher", str(good), "-o", str(tmp_path / "c"), *_student(), "data.seq_len=16"])
    assert "vocabulary sizes differ" in line  # the default (synthetic) data is not the teacher's tokenizer


def test_memory_estimate_counts_the_teachers_weights_exactly(teacher):
    """The size check reads the weights' bytes from the safetensors header (nothing loaded) and refuses a budget
    below weights + working memory, in one ConfigError."""
    from tcsm.builders.loading import load_checkpoint
    from tcsm.core.errors import ConfigError
    from tcsm.recipes.distill.builder import check_teacher_fits, inspect_teacher, teacher_working_memory

    spec = inspect_teacher(teacher)
    model = load_checkpoint(teacher).model
    assert spec.weight_bytes == sum(p.numel() * p.element_size() for p in model.state_dict().values())
    assert (spec.d_model, spec.n_layers, spec.max_len) == (model.cfg.d_model, model.cfg.n_layers, model.cfg.max_len)
    work = teacher_working_memory(spec, "topk", vocab_size=8, seq_len=16, batch=8, max_tokens=1024)
    assert work > 0
    need_gib = (spec.weight_bytes + max(spec.weight_bytes, work)) / 2**30
    check_teacher_fits(spec, work, "cpu", need_gib * 1.01, 1024)
    with pytest.raises(ConfigError, match="needs about"):
        check_teacher_fits(spec, work, "cpu", need_gib * 0.99, 1024)
