"""Zero-shot data preparation, generative perplexity and sample entropy (docs/evaluation.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tcsm.evaluation import (
    ScorerLM,
    build_blocks,
    generative_perplexity,
    lambada_detokenize,
    lm1b_detokenize,
    load_documents,
    prepare_zeroshot,
    ptb_detokenize,
    sample_entropy,
    unigram_entropy,
    wikitext_detokenize,
)
from tcsm.evaluation.report import plot_genppl_vs_steps, write_report

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
BPE = DATA / "gpt2_bpe"
needs_data = pytest.mark.skipif(not (DATA / "ptb").is_dir(), reason="../shared/data not present")
needs_bpe = pytest.mark.skipif(not (BPE / "encoder.json").is_file(), reason="GPT-2 BPE files not present")


def _bpe():
    from tcsm.data import gpt2_tokenizer

    return gpt2_tokenizer(str(BPE))


# --- detokenisers --------------------------------------------------------------------------------------


def test_wikitext_detokenizer_known_strings():
    assert wikitext_detokenize(" = = Career = = \n") == " == Career ==\n"
    line = " The 2 @,@ 000 @-@ strong army ( led by Bob ) , won 3 @.@ 5 games . \n"
    assert wikitext_detokenize(line) == " The 2,000-strong army (led by Bob), won 3.5 games.\n"
    assert wikitext_detokenize(' He said " yes " ; Teddy \'s dog . ') == ' He said "yes"; Teddy\'s dog. '


def test_ptb_detokenizer_known_strings():
    assert ptb_detokenize("no it was n't black monday") == "no it wasn't black monday"
    # Overlapping " N N N " runs need the repeated pass; "<unk>" becomes "?" and "\/" a slash.
    assert ptb_detokenize("prices rose N N N points at <unk> 's a\\/b") == "prices rose 1 1 1 points at ?'s a/b"
    assert ptb_detokenize("costs $ N N each") == "costs $1 1 each"


def test_lm1b_detokenizer_known_strings():
    assert lm1b_detokenize("Visit http : / / example.com now .") == "Visit http://example.com now."
    assert lm1b_detokenize('He said " hello , world " to me !') == 'He said "hello, world" to me!'
    assert lm1b_detokenize("It costs $ 5 ( about £ 3 ) , I 'm told") == "It costs $5 (about £3), I'm told"


def test_lambada_detokenizer_adds_separator_and_straight_quotes():
    assert lambada_detokenize("\u201cHi,\u201d she said.  ") == '\n"Hi," she said.'


# --- blocks --------------------------------------------------------------------------------------------


def test_build_blocks_sedd_layout_joins_with_eos_and_drops_tail():
    blocks, stats = build_blocks([[1, 2, 3], [4, 5]], 3, eos_id=9)
    assert blocks.tolist() == [[1, 2, 3], [9, 4, 5]]
    assert stats == {"num_documents": 2, "stream_tokens": 7, "dropped_tokens": 1}


def test_build_blocks_mdlm_layout_wraps_each_block():
    blocks, stats = build_blocks([[1, 2, 3], [4, 5]], 4, eos_id=9, bos_id=8, layout="mdlm")
    assert blocks.tolist() == [[8, 1, 2, 9], [8, 3, 9, 9], [8, 4, 5, 9]]
    assert stats["dropped_tokens"] == 1
    with pytest.raises(ValueError, match="layout"):
        build_blocks([[1]], 4, eos_id=9, layout="sliding")


def test_prepare_zeroshot_with_a_toy_data_root(tmp_path):
    (tmp_path / "ptb").mkdir()
    import gzip

    with gzip.open(tmp_path / "ptb" / "ptb.test.txt.gz", "wt") as f:
        f.write(" a b n't \n c \n")
    vocab = {w: i for i, w in enumerate(["a", "b", "c", "bn't"])}
    data = prepare_zeroshot(
        "ptb", lambda s: [vocab[w] for w in s.split()], block_size=2, eos_id=7, data_root=tmp_path
    )
    # "a b n't" → "a bn't"; stream = a bn't EOS c EOS → 2 blocks of 2, 1 token dropped.
    assert data.blocks.tolist() == [[0, 3], [7, 2]]
    assert data.protocol["dropped_tokens"] == 1 and data.protocol["num_documents"] == 2
    with pytest.raises(FileNotFoundError, match="wikitext2"):
        load_documents("wikitext2", tmp_path)
    with pytest.raises(ValueError, match="unknown zero-shot set"):
        load_documents("enwik8", tmp_path)


@needs_data
def test_real_zeroshot_sets_have_the_documented_document_counts():
    counts = {name: len(load_documents(name, DATA)) for name in ("wikitext2", "ptb", "lambada", "lm1b")}
    assert counts == {"wikitext2": 2891, "ptb": 3761, "lambada": 5153, "lm1b": 12105}


@needs_data
@needs_bpe
def test_real_ptb_blocks_follow_the_protocol():
    tok = _bpe()
    data = prepare_zeroshot("ptb", tok, block_size=1024, eos_id=50256, data_root=DATA)
    p = data.protocol
    assert data.blocks.shape == (p["stream_tokens"] // 1024, 1024)
    assert p["num_blocks"] == p["stream_tokens"] // 1024 and p["dropped_tokens"] < 1024
    first = tok.encode(ptb_detokenize(load_documents("ptb", DATA)[0]))
    assert data.blocks[0, : len(first) + 1].tolist() == [*first, 50256]
    assert int(data.blocks.max()) < 50257


# --- generative perplexity -----------------------------------------------------------------------------


def _tiny_gpt2(vocab_size=50, n_positions=16):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=vocab_size, n_positions=n_positions, n_embd=16, n_layer=1, n_head=2, bos_token_id=0,
        eos_token_id=1,
    )
    return transformers.GPT2LMHeadModel(cfg).eval()


def _manual_nll(model, seq, eos=None, window=None):
    """Σ −log p(y_j | y_<j) by one call per window, counting the first EOS only."""
    total, n, seen_eos = 0.0, 0, False
    window = window or len(seq)
    for s in range(0, len(seq), window):
        w = torch.tensor(seq[s : s + window])
        with torch.no_grad():
            lp = torch.log_softmax(model(w[None]).logits[0].double(), -1)
        for j in range(len(w)):
            if eos is not None and int(w[j]) == eos:
                if seen_eos:
                    continue
                seen_eos = True
            if j == 0:
                continue
            total -= float(lp[j - 1, w[j]])
            n += 1
    return total, n


def test_genppl_with_tiny_hf_gpt2_matches_manual_computation():
    model = _tiny_gpt2()
    ref = ScorerLM.from_hf(model)
    seqs = [[3, 4, 5, 6, 7], [8, 9, 1, 10, 1, 11, 12], [13, 14]]  # ragged; the 2nd repeats EOS (id 1)
    res = generative_perplexity(ref, token_ids=seqs, batch_size=2)
    parts = [_manual_nll(model, s, eos=1) for s in seqs]
    total, n = sum(p[0] for p in parts), sum(p[1] for p in parts)
    assert res.num_tokens == n == 4 + 5 + 1
    assert res.nll_nats_per_token == pytest.approx(total / n, rel=1e-5)
    assert res.gen_ppl == pytest.approx(math.exp(total / n), rel=1e-5)
    assert res.per_sequence_nll[0] == pytest.approx(parts[0][0] / parts[0][1], rel=1e-5)
    every = generative_perplexity(ref, token_ids=seqs, count_repeated_eos=True)
    assert every.num_tokens == n + 1


def test_genppl_scores_long_samples_in_context_windows():
    model = _tiny_gpt2(n_positions=16)
    ref = ScorerLM.from_hf(model)
    ref.context_length = 4
    seq = list(range(2, 13))  # 11 tokens → windows of 4, 4, 3
    res = generative_perplexity(ref, token_ids=[seq])
    total, n = _manual_nll(model, seq, window=4)
    assert res.num_tokens == n == 3 + 3 + 2
    assert res.nll_nats_per_token == pytest.approx(total / n, rel=1e-5)


@needs_bpe
def test_genppl_retokenizes_text_with_the_reference_tokenizer():
    transformers = pytest.importorskip("transformers")
    # Built from the tokenizers object: the same call works on transformers 4.x and 5.x.
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=_bpe().hf._tokenizer, eos_token="<|endoftext|>", bos_token="<|endoftext|>"
    )
    model = _tiny_gpt2(vocab_size=50257, n_positions=64)
    ref = ScorerLM.from_hf(model, tok)
    texts = ["The cat sat on the mat.", "Hello world, hello world!"]
    res = generative_perplexity(ref, texts=texts)
    direct = generative_perplexity(ref, token_ids=[tok.encode(t) for t in texts])
    assert res.gen_ppl == pytest.approx(direct.gen_ppl, rel=1e-6)
    assert res.num_tokens == sum(len(tok.encode(t)) - 1 for t in texts)


def test_genppl_with_a_project_causal_lm_scores_every_token():
    from tcsm.models.causal import CausalLM
    from tcsm.models.lm import LMConfig

    torch.manual_seed(0)
    model = CausalLM(LMConfig(vocab_size=11, max_len=8, d_model=16, n_layers=1, n_heads=2)).eval()
    torch.nn.init.normal_(model.head.weight)  # the zero-initialised head would make every token log V
    seqs = [[1, 2, 3, 4], [5, 6]]
    res = generative_perplexity(ScorerLM.from_tcsm(model), token_ids=seqs)
    with torch.no_grad():
        expected = -sum(float(model.log_prob(torch.tensor([s]))) for s in seqs) / 6
    assert res.num_tokens == 6
    assert res.nll_nats_per_token == pytest.approx(expected, rel=1e-5)


def test_genppl_argument_errors():
    ref = ScorerLM.from_callable(lambda ids: torch.zeros(*ids.shape, 5))
    with pytest.raises(ValueError, match="exactly one"):
        generative_perplexity(ref)
    with pytest.raises(ValueError, match="no tokenizer"):
        generative_perplexity(ref, texts=["abc"])
    # A uniform reference over 5 tokens has gen-PPL exactly 5.
    assert generative_perplexity(ref, token_ids=[[0, 1, 2]]).gen_ppl == pytest.approx(5.0)


# --- entropy -------------------------------------------------------------------------------------------


def test_unigram_entropy_of_known_sequences():
    assert unigram_entropy([0, 0, 1, 1]) == pytest.approx(math.log(2))
    assert unigram_entropy([5, 5, 5]) == 0.0
    assert unigram_entropy(torch.tensor([0, 1, 2, 3])) == pytest.approx(math.log(4))
    assert unigram_entropy([0, 0, 0, 1], ignore_ids=[1]) == 0.0
    out = sample_entropy(torch.tensor([[0, 0, 1, 1], [2, 2, 2, 2]]))
    assert out["entropy_mean"] == pytest.approx(math.log(2) / 2)
    assert out["entropy_per_sample"] == pytest.approx([math.log(2), 0.0])


# --- report --------------------------------------------------------------------------------------------


def test_report_and_plot(tmp_path):
    rows = [{"steps": k, "gen_ppl": 100.0 / k, "entropy_mean": 5.0 + k / 100} for k in (8, 32, 128)]
    out = write_report(tmp_path / "r.json", {"genppl_vs_steps": rows})
    data = json.loads(out.read_text())
    assert data["genppl_vs_steps"] == rows and "tcsm_version" in data["meta"]
    png = plot_genppl_vs_steps(rows, tmp_path / "p.png")
    assert png.is_file() and png.stat().st_size > 1000
