"""The evaluation-harness requests (tcsm.evaluation.harness) against exact enumeration, and the lm-eval adapter
(tcsm.cli.lmeval) on local task files over ../shared/data (nothing is downloaded)."""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import sys
import types
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "sampling"))
from test_samplers import exact_denoiser

from tcsm.evaluation.exact import EnumerableDistribution
from tcsm.evaluation.harness import DiffusionHarness
from tcsm.paths import MaskedPath
from tcsm.sampling.settings import SampleSettings

pytestmark = pytest.mark.usefixtures("one_thread")
DATA = Path(os.environ.get("TCSM_DATA_DIR") or Path(__file__).resolve().parents[2] / ".." / "shared" / "data")
LAMBADA = DATA / "lambada" / "lambada_test.jsonl.gz"
needs_data = pytest.mark.skipif(
    not LAMBADA.exists(), reason="../shared/data not present (or set TCSM_DATA_DIR)"
)


@pytest.fixture(scope="module")
def toy():
    d = EnumerableDistribution.random(3, 3, seed=3, concentration=0.3)
    path = MaskedPath(3)
    return d, DiffusionHarness(exact_denoiser(d, path), path, 3, num_t=256)


def _log_cond(d, ctx, cont):
    st, p = d.states, d.probs
    full = (st[:, : len(ctx) + len(cont)] == torch.tensor(ctx + cont)).all(-1)
    given = (
        (st[:, : len(ctx)] == torch.tensor(ctx, dtype=torch.long)).all(-1) if ctx else torch.ones_like(full)
    )
    return math.log(float(p[full].sum() / p[given].sum()))


@pytest.mark.parametrize("ctx,cont", [([0], [1, 2]), ([], [0, 1, 2]), ([2, 1], [0]), ([1, 1], [1])])
def test_the_bound_of_the_exact_denoiser_is_the_conditional_log_likelihood(toy, ctx, cont):
    # The masked bound is tight for the exact denoiser (MATH.md §2.2), so the estimate is log p(cont | ctx) ± MC
    d, h = toy
    r = h.loglikelihood(ctx, cont)
    assert 0 < r.stderr < 0.2
    assert abs(r.value - _log_cond(d, ctx, cont)) < 4 * r.stderr + 1e-9
    assert h.loglikelihood(ctx, cont) == r  # seeded per request


def test_greedy_is_the_argmax_continuation(toy):
    d, h = toy
    post = d.denoiser(h.path)(torch.tensor([[0, 3, 3]]), torch.tensor([0.5]))[0]
    best = post.argmax(-1).tolist()
    assert h.loglikelihood([0], best[1:]).is_greedy
    other = [(best[1] + 1) % 3, best[2]]
    assert not h.loglikelihood([0], other).is_greedy


def test_rolling_sums_independent_windows(toy):
    d, h = toy
    a, b = [0, 1, 2], [2, 2, 1]
    r = h.loglikelihood_rolling(a + b)
    assert abs(r.value - _log_cond(d, [], a) - _log_cond(d, [], b)) < 4 * r.stderr


@pytest.mark.parametrize("method", ["ancestral", "margin", "threshold"])
def test_generate_keeps_the_context_and_draws_the_rest_exactly(toy, method):
    d, h = toy
    h = DiffusionHarness(h.model, h.path, 3, num_t=2, settings=SampleSettings(method=method, steps=2))
    outs = [tuple(h.generate([1], 2, index=i)) for i in range(400)]
    assert all(len(o) == 2 for o in outs)
    # the most likely continuation under p_1(· | x^1 = 1) is also the most frequent draw
    cands = {o: _log_cond(d, [1], list(o)) for o in set(outs)}
    assert max(set(outs), key=outs.count) == max(cands, key=cands.get)


# --- the lm-eval adapter ---------------------------------------------------------------------------------


class Chars:
    """text8's alphabet: space and a–z."""

    chars = " abcdefghijklmnopqrstuvwxyz"

    def encode(self, s):
        return [self.chars.index(c) for c in s]

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids)


def _tiny_harness(**settings):
    from tcsm.models import build_denoiser

    torch.manual_seed(0)
    model = build_denoiser("tiny", vocab_size=27, num_states=28, max_len=32, time_conditioning=False).eval()
    return DiffusionHarness(model, MaskedPath(27), 32, num_t=4, settings=SampleSettings(**settings))


def _lambada_docs(n: int) -> list[dict]:
    """The first LAMBADA passages in text8's alphabet: the last word is the target."""
    docs = []
    with gzip.open(LAMBADA, "rt", encoding="utf-8") as f:
        for line in f:
            words = re.sub("[^a-z ]", "", json.loads(line)["text"].lower()).split()
            docs.append({"context": " ".join(words[-6:-1]), "target": " " + words[-1]})
            if len(docs) == n:
                return docs
    return docs


def _request(*args):
    return types.SimpleNamespace(args=args)


@needs_data
def test_adapter_methods_answer_every_request():
    from tcsm.cli.lmeval import _Adapter

    lm = _Adapter(_tiny_harness(method="confidence", steps=8), Chars())
    docs = _lambada_docs(3)
    ll = lm.loglikelihood([_request(d["context"], d["target"]) for d in docs])
    assert len(ll) == 3 and all(v < 0 and isinstance(g, bool) for v, g in ll)
    assert len(lm.stderrs) == 3 and all(s > 0 for s in lm.stderrs)
    rolled = lm.loglikelihood_rolling([_request(d["context"] + d["target"]) for d in docs])
    assert all(v < 0 for v in rolled)
    gen = lm.generate_until([_request(d["context"], {"until": ["q"], "max_gen_toks": 8}) for d in docs])
    assert all(len(g) <= 8 and "q" not in g and set(g) <= set(Chars.chars) for g in gen)


TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: {output_type}
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{target}}}}"
{extra}
"""


@needs_data
def test_lm_eval_runs_offline_on_local_tasks(tmp_path, monkeypatch):
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    from tcsm.cli.lmeval import register

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data = tmp_path / "lambada_text8.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in _lambada_docs(4)))
    gen = 'generation_kwargs:\n  until: ["q"]\n  max_gen_toks: 6\nmetric_list:\n  - metric: exact_match'
    roll = 'doc_to_target: "{{context}}"\nmetric_list:\n  - metric: word_perplexity\n  - metric: bits_per_byte'
    tasks = {
        "tcsm_lambada_ll": ("loglikelihood", "metric_list:\n  - metric: acc\n  - metric: perplexity"),
        "tcsm_lambada_gen": ("generate_until", gen),
        "tcsm_lambada_roll": ("loglikelihood_rolling", roll),
    }
    for name, (kind, extra) in tasks.items():
        (tmp_path / f"{name}.yaml").write_text(
            TASK.format(name=name, data=data, output_type=kind, extra=extra)
        )
    lm = register()(harness=_tiny_harness(method="margin", steps=4), tokenizer=Chars())
    out = lm_eval.simple_evaluate(
        model=lm, tasks=list(tasks), task_manager=TaskManager(include_path=str(tmp_path))
    )
    res = out["results"]
    assert 0.0 <= res["tcsm_lambada_ll"]["acc,none"] <= 1.0
    assert res["tcsm_lambada_ll"]["perplexity,none"] > 1.0
    assert 0.0 <= res["tcsm_lambada_gen"]["exact_match,none"] <= 1.0
    assert res["tcsm_lambada_roll"]["bits_per_byte,none"] > 0


def test_the_adapter_reads_a_run_and_its_tokenizer(tmp_path):
    """model_args arrive as strings: checkpoint, num_t and the sampler settings build the harness of a run."""
    from train_helpers import tiny

    from tcsm.builders.config import load_config
    from tcsm.cli.lmeval import _Adapter
    from tcsm.cli.train import train

    with torch.random.fork_rng(devices=[]):
        train(load_config("synthetic", tiny("train.steps=2", "train.eval_every=0", "sample.num=0")), tmp_path / "r",
              log=lambda s: None)  # fmt: skip
    lm = _Adapter(checkpoint=str(tmp_path / "r"), num_t="4", method="entropy", steps="3", no_ema="true")
    assert (lm.harness.num_t, lm.harness.settings.method, lm.harness.settings.steps) == (4, "entropy", 3)
    ((v, greedy),) = lm.loglikelihood([_request("ab", "ba")])
    assert v < 0 and isinstance(greedy, bool) and len(lm.stderrs) == 1
    (text,) = lm.generate_until([_request("ab", {"until": [], "max_gen_toks": 5})])
    assert len(text) == 5
    with pytest.raises(ValueError, match="checkpoint="):
        _Adapter()
