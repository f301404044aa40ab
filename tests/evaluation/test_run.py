"""evaluate_model on rows that pin a prompt: the completion | prompt bound, whatever the objective."""

from types import SimpleNamespace

import torch

from tcsm.data.build import build_data
from tcsm.evaluation.run import evaluate_model, prompted_bound
from tcsm.paths import MaskedPath
from tcsm.posttrain.sft.objective import SFTObjective


class _Denoiser(torch.nn.Module):
    def __init__(self, V, L):
        super().__init__()
        self.logits = torch.nn.Parameter(torch.randn(L, V, generator=torch.Generator().manual_seed(0)))

    def forward(self, x, t, **_):
        return self.logits.expand(x.shape[0], -1, -1) + 0.1 * (x[..., None] == 0)


def test_prompted_rows_get_the_completion_given_prompt_bound_the_sft_objective_reports():
    data = build_data({"kind": "task", "task": "addition", "options": {"digits": 2}, "num_train": 6, "num_valid": 5,
                       "num_test": 0})  # fmt: skip
    path = MaskedPath(data.vocab_size)
    model = _Denoiser(data.vocab_size, data.seq_len)
    e = SimpleNamespace(batch_size=2, num_t=3, bound=None)
    got = evaluate_model(object(), model, data.valid, path, e, generator=torch.Generator().manual_seed(1))
    want = SFTObjective(None, path, eval_num_t=3).evaluate(model, data.valid, batch_size=2,
                                                           generator=torch.Generator().manual_seed(1))  # fmt: skip
    assert got["bound"] == want["bound"] == "masked, completion | prompt" and got["num_sequences"] == 5
    assert got["nats_per_token"] == want["nats_per_token"] and got["num_t"] == 3
    # pinning the prompt changes the number: the prompt positions are neither noised nor scored
    plain = evaluate_model(object(), model, data.valid.x1.long(), path, e, generator=torch.Generator().manual_seed(1))
    assert plain["bound"] == "masked" and plain["nats_per_token"] != got["nats_per_token"]
    direct = prompted_bound(model, data.valid, path, batch_size=2, num_t=3, generator=torch.Generator().manual_seed(1))
    assert direct["nats_per_token"] == got["nats_per_token"]


def test_prompted_rows_take_eval_t_max():
    """eval.t_max reaches the completion | prompt bound (a time-blind uniform model's reward or SFT run)."""
    from tcsm.paths import UniformPath

    data = build_data({"kind": "task", "task": "addition", "options": {"digits": 2}, "num_train": 6, "num_valid": 5,
                       "num_test": 0})  # fmt: skip
    path = UniformPath(data.vocab_size)
    model = _Denoiser(data.vocab_size, data.seq_len)
    e = SimpleNamespace(batch_size=2, num_t=3, bound=None, t_max=0.9)
    got = evaluate_model(object(), model, data.valid, path, e, generator=torch.Generator().manual_seed(1))
    assert got["bound"].endswith("@t_max=0.9, completion | prompt") and got["t_max"] == 0.9
    whole = evaluate_model(object(), model, data.valid, path, SimpleNamespace(batch_size=2, num_t=3, bound=None),
                           generator=torch.Generator().manual_seed(1))  # fmt: skip
    assert whole["nats_per_token"] != got["nats_per_token"]
