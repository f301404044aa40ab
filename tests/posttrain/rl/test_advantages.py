"""Group-relative advantages (tcsm.posttrain.rl.advantages) of integer rewards: centred (and scaled) in floating
point, never cast back to the rewards' integer dtype."""

from __future__ import annotations

import pytest
import torch

from tcsm.posttrain.rl.advantages import group_advantages


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
@pytest.mark.parametrize("scale", [False, True])
def test_integer_rewards_give_float_advantages(dtype, scale):
    r = torch.tensor([[1, 0, 0], [1, 1, 0]]).to(dtype)
    a = group_advantages(r, scale=scale)
    assert a.dtype == torch.float32
    centred = torch.tensor([[2.0, -1.0, -1.0], [1.0, 1.0, -2.0]]) / 3
    want = centred * 3**0.5 if scale else centred  # each group's unbiased std is 3^(−1/2)
    torch.testing.assert_close(a, want)


def test_float_rewards_keep_their_dtype():
    r = torch.tensor([[1.0, 0.0, 0.5]], dtype=torch.float64)
    assert group_advantages(r, scale=False).dtype == torch.float64
    assert group_advantages(r.half(), scale=False).dtype == torch.float16
