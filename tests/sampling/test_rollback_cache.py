"""RollbackCache (tcsm.sampling.rollback_cache): outputs against the kept prefix equal a full forward pass, after
edits that roll it back, at batch 1 (one prefill) and with a start position per row (CausalLM.decode)."""

from __future__ import annotations

import pytest
import torch

from tcsm.models.causal import CausalLM
from tcsm.models.lm import LMConfig
from tcsm.sampling.rollback_cache import RollbackCache

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("batch", [1, 3])
def test_outputs_follow_the_edited_sequence(batch):
    torch.manual_seed(0)
    model = CausalLM(LMConfig(vocab_size=5, max_len=8, d_model=16, n_layers=2, n_heads=2)).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.5)
    cache = RollbackCache(model, batch, 8, "cpu")
    x = torch.randint(0, 5, (batch, 8), generator=torch.Generator().manual_seed(1))
    # (first, last, position edited before the call): a prefix, an edit inside it, the last position, per-row spans
    steps = [((0,) * 3, (3,) * 3, None), ((2,) * 3, (6,) * 3, 1), ((7,) * 3, (7,) * 3, None), ((1, 2, 5), (4, 2, 7), 0)]
    starts = []
    for first, last, edit in steps:
        if edit is not None:
            x[:, edit] = (x[:, edit] + 1) % 5
        first, last = torch.tensor(first[:batch]), torch.tensor(last[:batch])
        logits, start = cache.outputs(x, first, last)
        full = model(x)
        for r in range(batch):
            got = logits[r, first[r] - start[r] : last[r] - start[r] + 1]
            torch.testing.assert_close(got, full[r, first[r] : last[r] + 1], atol=1e-5, rtol=1e-5)
        starts.append(start.tolist())
    # only what changed is fed again: the edit at x^1 keeps input positions 0..1, the last position reuses 0..6 ...
    assert starts[1] == [2] * batch and starts[2] == [7] * batch
    assert starts[3] == [1] * batch  # ... and the edit at x^0 keeps only BOS
    assert cache.passes == 4
