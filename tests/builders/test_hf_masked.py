"""A masked diffusion LM directory with its own modeling code as a tcsm denoiser (its family module,
tcsm.builders.hf_masked): tcsm's mask V is the model's mask id, the mask id's own logit is dropped, Dream-style
shifted logits, the state dict under the model's own names, one-line errors for a directory of another family, a
missing trust_remote_code and another tokenizer; and LLaDA's SFT loss is tcsm's masked SFT objective."""

from __future__ import annotations

import builtins
import json

import pytest
import torch
from llada_helpers import write_masked_dlm
from train_helpers import restore_torch_threads, tiny  # noqa: F401

from tcsm.builders.config import load_config
from tcsm.builders.hf_masked import MASK_LOGIT, HFMaskedDLM
from tcsm.core.batch import Batch
from tcsm.core.errors import ConfigError
from tcsm.objectives import Objective
from tcsm.paths import MaskedPath
from tcsm.posttrain.sft.objective import SFTObjective
from tcsm.train.trainer import Trainer

tf = pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def no_prompt(monkeypatch):
    monkeypatch.setattr(builtins, "input", lambda *a, **k: (_ for _ in ()).throw(AssertionError("prompted")))


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    return write_masked_dlm(tmp_path_factory.mktemp("dlm") / "m")


def _own(d):
    return tf.AutoModel.from_pretrained(str(d), trust_remote_code=True).eval()


def test_the_mask_is_the_models_mask_id_and_never_a_clean_value(directory):
    own = _own(directory)
    model = HFMaskedDLM(own, 16, 15)
    x = torch.tensor([[0, 16, 3, 16], [16, 16, 14, 2]])  # 16 = tcsm's [MASK] (V)
    ids = torch.tensor([[0, 15, 3, 15], [15, 15, 14, 2]])
    with torch.no_grad():
        got, want = model(x, torch.rand(2)), own(input_ids=ids).logits
    assert torch.equal(got[..., :15], want[..., :15]) and (got[..., 15] == MASK_LOGIT).all()
    assert torch.softmax(got, -1)[..., 15].max() == 0  # probability 0 to float precision
    assert model.num_states == 17 and model.mask_id == 16


def test_shifted_logits_read_the_output_of_the_position_before(directory):
    own = _own(directory)
    model = HFMaskedDLM(own, 15, 15, shift_logits=True)  # a vocabulary without the mask token: nothing dropped
    x = torch.randint(0, 16, (2, 6))
    with torch.no_grad():
        got, raw = model(x), own(input_ids=model.input_ids(x)).logits[..., :15]
    assert torch.equal(got[:, 1:], raw[:, :-1]) and torch.equal(got[:, 0], raw[:, 0])


def test_the_state_dict_has_the_models_own_names(directory):
    own = _own(directory)
    model = HFMaskedDLM(own, 16, 15)
    assert set(model.state_dict()) == set(own.state_dict())
    other = HFMaskedDLM(_own(directory), 16, 15)
    with torch.no_grad():
        for p in other.parameters():
            p.zero_()
    other.load_state_dict(model.state_dict())
    x = torch.randint(0, 17, (2, 5))
    assert torch.equal(other(x), model(x))


def _cfg(d, *extra):
    return load_config("synthetic", [o for o in tiny("data.seq_len=12") if not o.startswith("model.")]
                       + ["model.name=hf_masked_dlm", f"model.name_or_path={d}", "data.vocab_size=16", *extra])  # fmt: skip


def test_a_directory_loads_as_it_is_and_the_wrong_ones_are_one_line(directory, tmp_path):
    model = Trainer.from_config(_cfg(directory, "model.trust_remote_code=true"), None, log=lambda s: None).model
    x = torch.randint(0, 17, (2, 12))
    with torch.no_grad():
        assert torch.equal(model(x)[..., :15], _own(directory)(input_ids=model.input_ids(x)).logits[..., :15])
    cases = {"trust_remote_code=true": _cfg(directory)}
    plain = tmp_path / "plain"  # a directory of another family: no mask_token_id
    tf.BertConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=8).save_pretrained(plain)  # fmt: skip
    cases["not a masked diffusion LM"] = _cfg(plain, "model.trust_remote_code=true")
    cases["path.source=masked"] = _cfg(directory, "model.trust_remote_code=true", "path.source=uniform")
    cases["at most 64"] = _cfg(directory, "model.trust_remote_code=true", "data.seq_len=80")
    for want, cfg in cases.items():
        with pytest.raises(ConfigError) as e:
            Trainer.from_config(cfg, None, log=lambda s: None)
        assert want in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_data_of_another_tokenizer_is_refused_in_one_line(directory, tmp_path):
    from tcsm.builders.hf_masked import _check_tokenizer
    from tcsm.builders.registry import BuildContext

    vocab = json.loads((directory / "tokenizer.json").read_text())["model"]["vocab"]
    swapped = {t: (1 - i if i < 2 else i) for t, i in vocab.items()}  # the same tokens, ids 0 and 1 exchanged
    tok = type("T", (), {"hf": type("H", (), {"get_vocab": lambda self, with_added_tokens=True: swapped})()})()
    ctx = BuildContext(config=None, device=None, data=type("D", (), {"tokenizer": tok, "vocab_size": 16})())
    with pytest.raises(ConfigError) as e:
        _check_tokenizer(str(directory), ctx)
    assert "another tokenizer" in str(e.value) and "\n" not in str(e.value)


class _Recorder(torch.nn.Module):
    """A denoiser that remembers its input, to recompute a loss from it by hand."""

    def __init__(self, model):
        super().__init__()
        self.model, self.seen = model, None

    def forward(self, xt, t):
        self.seen = (xt.clone(), t.clone())
        return self.model(xt, t)


def test_llada_sft_loss_is_tcsms_masked_sft_objective(directory):
    """LLaDA's SFT loss per sequence, Σ_{masked response i} −log p(x^i | x_t) / p_mask / L_response with p_mask = 1 − t
    (tcsm's time, linear schedule), times L_response / L, is tcsm's distrib loss with the κ_t = 1/(1 − t) weighting,
    the prompt never masked (cond_mask); with objective.normalize=response the factor is gone."""
    model = _Recorder(HFMaskedDLM(_own(directory), 16, 15))
    path = MaskedPath(16)
    x1 = torch.randint(0, 15, (4, 10), generator=torch.Generator().manual_seed(0))
    cond = torch.zeros(4, 10, dtype=torch.bool)
    cond[:, :3] = True
    cond[1, :6] = True  # prompts of different lengths
    objective = Objective(path, loss="distrib", weighting="kappa")
    loss, _ = objective(model, Batch(x1=x1, cond_mask=cond), torch.Generator().manual_seed(1))
    xt, t = model.seen
    assert not (xt[cond] == 16).any()  # the prompt is conditioning
    with torch.no_grad():
        ce = torch.nn.functional.cross_entropy(model.model(xt).transpose(1, 2), x1, reduction="none")
    masked = xt == 16
    t = t.reshape(-1)[:4] if t.dim() == 1 else t[:, 0]
    response = (~cond).sum(-1)
    llada = (ce * masked).sum(-1) / (1 - t) / response  # LLaDA's per-sequence loss
    torch.testing.assert_close(loss, (llada * response / x1.shape[1]).mean(), atol=1e-5, rtol=1e-5)
    # objective.normalize=response: the SFT objective is LLaDA's loss itself (the same draws: the same generator)
    sft = SFTObjective(objective, path, normalize="response")
    loss, _ = sft(model, Batch(x1=x1, cond_mask=cond), torch.Generator().manual_seed(1))
    assert torch.equal(model.seen[0], xt)
    torch.testing.assert_close(loss, llada.mean(), atol=1e-5, rtol=1e-5)
