"""Pieces that compose (issue 34, item 4) and the sampler's reported cost (item 8): text rewards on a shards run
(`tcsm pairs`, `tcsm finetune reward`), the lm-eval adapter on a model started from a Hugging Face LM
(`model.name=hf_denoiser`), `--threshold` only with the threshold order, and `tcsm sample` reporting batched
calls and evaluations per sequence. Tiny runs trained here on a character corpus (a few seconds each)."""

from __future__ import annotations

import json

import pytest
import torch
from train_helpers import restore_torch_threads, tiny  # noqa: F401

from tcsm.cli import main
from tcsm.data.prepare import prepare

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = ["good", "bad", "happy", "sad", "great", "awful", "nice", "the", "day", "was", "a", "film"]
DOCS = [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(6 + i % 5)) + "." for i in range(80)]
RUN = ("data.seq_len=24", "model.max_len=24", "model.time_conditioning=false", "train.steps=2", "train.eval_every=0",
       "train.sample_every=0", "sample.num=0")  # fmt: skip


@pytest.fixture(scope="module")
def shards_run(tmp_path_factory):
    """A prepared character corpus (data.kind=shards) and a 2-step masked-diffusion run on it."""
    root = tmp_path_factory.mktemp("compose")
    (root / "c.txt").write_text("\n".join(DOCS), encoding="utf-8")
    prepare([str(root / "c.txt")], root / "shards", "char", doc_separator="\n", progress=False)
    argv = ["train", "-o", str(root / "run"), *tiny("data.kind=shards", f"data.path={root / 'shards'}", *RUN,
                                                    synthetic=False)]  # fmt: skip
    torch.manual_seed(0)
    assert main(argv) == 0
    return root / "run"


def test_pairs_with_a_text_reward_on_a_shards_run(shards_run, tmp_path, capsys):
    out = tmp_path / "pairs.jsonl"
    rc = main(["pairs", "--from", str(shards_run), "--reward", "vader", "-n", "3", "--group", "4", "--steps", "4",
               "-o", str(out), "--prompt", "good"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 0, err
    rows = [json.loads(r) for r in out.read_text(encoding="utf-8").splitlines()]
    assert rows and all(r["prompt"] == "good" and isinstance(r["chosen"], str) for r in rows)
    assert all(r["chosen_reward"] >= r["rejected_reward"] for r in rows)


def test_reward_finetune_with_a_text_reward_on_a_shards_run(shards_run, tmp_path, capsys):
    rc = main(["finetune", "reward", "--from", str(shards_run), "--reward", "vader", "-B", "2", "--xt-source", "data",
               "--steps", "1", "--eval-samples", "2", "-o", str(tmp_path / "ft"), "train.batch_size=4",
               "train.device=cpu", "train.threads=1", "train.progress=false", "train.tensorboard=false",
               "train.eval_every=0", "train.sample_every=0", "sample.num=0", "sample.steps=4"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 0, err
    report = json.loads((tmp_path / "ft" / "reward_eval.json").read_text())
    assert report["num_samples"] == 2


def _sample(capsys, run, *argv):
    rc = main(["sample", str(run), "--no-progress", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.err


def test_threshold_with_another_method_is_an_error(shards_run, capsys):
    rc, err = _sample(capsys, shards_run, "-n", 2, "--steps", 4, "--method", "margin", "--threshold", 0.3)
    assert rc != 0 and len(err.strip().splitlines()) == 1 and "--method threshold" in err, err
    rc, err = _sample(capsys, shards_run, "-n", 2, "--steps", 4, "--threshold", 0.3)  # the run's method: ancestral
    assert rc != 0 and "method threshold" in err, err
    rc, err = _sample(capsys, shards_run, "-n", 2, "--steps", 4, "--method", "threshold", "--threshold", 0.3)
    assert rc == 0, err


def test_sample_reports_batched_calls_and_calls_per_sequence(shards_run, capsys):
    # 16 sequences, 64 cached ancestral steps: a batched call runs while any row still changes, while each row is
    # evaluated only after its own changes (at most L + 1 = 25 times)
    rc, err = _sample(capsys, shards_run, "-n", 16, "--batch-size", 16, "--steps", 64)
    assert rc == 0, err
    batched = int(err.split(" network calls")[0].rsplit(" ", 1)[1])
    per_seq = float(err.split(" per sequence")[0].rsplit(" ", 1)[1])
    assert per_seq <= 25 < batched <= 64


def test_row_evaluations_count_each_sequence():
    from tcsm.paths import MaskedPath
    from tcsm.sampling import sample
    from tcsm.sampling.common import CallCount, row_evaluations

    path = MaskedPath(3)
    den = lambda xt, t: torch.zeros(xt.shape[0], xt.shape[1], 3)
    _, st = sample(den, path, batch_size=8, length=6, num_steps=32, time_independent=True, return_stats=True,
                   generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert row_evaluations(st, 8) == int(st.row_calls.sum()) < st.num_calls * 8
    assert row_evaluations(CallCount("left-to-right", 6), 4) == 24


# --------------------------------------------------------------------------------------------------- lm-eval


def test_lmeval_adapter_evaluates_a_model_started_from_a_hugging_face_lm(tmp_path):
    tf = pytest.importorskip("transformers")
    from tcsm.cli.lmeval import harness_from_checkpoint

    (tmp_path / "c.txt").write_text("\n".join(DOCS), encoding="utf-8")
    V = len(set("\n".join(DOCS)))
    cfg = tf.BertConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=2, max_position_embeddings=32, architectures=["BertForMaskedLM"])  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        tf.AutoModelForMaskedLM.from_config(cfg).save_pretrained(tmp_path / "bert")
        base = [o for o in tiny(*RUN, synthetic=False) if not o.startswith("model.")]
        argv = ["train", "-o", str(tmp_path / "run"), *base, "data.kind=text", f"data.path={tmp_path / 'c.txt'}",
                "data.valid_frac=0.1", "data.test_frac=0.1", "model.name=hf_denoiser",
                f"model.name_or_path={tmp_path / 'bert'}", f"model.token_ids={list(range(8, 8 + V))}"]  # fmt: skip
        assert main(argv) == 0
    h, tok = harness_from_checkpoint(str(tmp_path / "run"), num_t=2, method="margin", steps=4)
    r = h.loglikelihood(tok.encode("good day"), tok.encode(" was"))
    assert r.value < 0 and r.stderr >= 0
    assert len(h.generate(tok.encode("good"), 4)) == 4
