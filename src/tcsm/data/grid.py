"""The paper's 2-D discrete grid distribution (App. E, `fig:grid_samples`): points of a W × W grid as
length-2 sequences (x^0, x^1) over W values (x^0 is the horizontal coordinate, "left half" is x^0 < W/2).

p_1 is a mixture of `num_modes` discretised isotropic Gaussians placed on a ring around the grid centre, at
angles offset by half a sector so that no mode straddles the vertical midline: half of the modes lie in each
half. The table is exact (float64), so the metrics of the reward demo — the mass in the right half and the
total variation to p_1 restricted to the left half — are computed against the true distribution.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from tcsm.data.base import DataBundle, DataError, compact_dtype

__all__ = ["GridDistribution", "build_grid", "histogram", "right_fraction", "total_variation"]


class GridDistribution:
    """p_1 over {0..W−1}² as a [W, W] table indexed [x^0, x^1]; a ring of Gaussian modes."""

    def __init__(self, width: int = 128, num_modes: int = 8, radius: float = 0.32, std: float = 1 / 40):
        if int(width) < 4 or int(width) % 2:
            raise DataError(f"grid width must be an even integer >= 4, got {width}")
        if int(num_modes) < 2 or int(num_modes) % 2:
            raise DataError(
                f"grid num_modes must be an even integer >= 2 (half in each half), got {num_modes}"
            )
        if not (0 < radius < 0.5 and std > 0):
            raise DataError(
                f"grid radius must be in (0, 0.5) and std > 0 (fractions of the width), got {radius}, {std}"
            )
        self.width, self.num_modes, self.radius, self.std = (
            int(width),
            int(num_modes),
            float(radius),
            float(std),
        )
        W = self.width
        c = (W - 1) / 2
        angles = (np.arange(self.num_modes) + 0.5) * 2 * math.pi / self.num_modes
        self.centres = np.stack([c + radius * W * np.cos(angles), c + radius * W * np.sin(angles)], 1)
        s = std * W
        grid = np.arange(W, dtype=np.float64)
        dens = np.zeros((W, W))
        for cx, cy in self.centres:
            dens += np.exp(-((grid[:, None] - cx) ** 2 + (grid[None, :] - cy) ** 2) / (2 * s * s))
        self.table = torch.from_numpy(dens / dens.sum())  # [x^0, x^1]

    @property
    def probs(self) -> Tensor:
        """p_1 flattened over sequences in row-major order (index = x^0·W + x^1)."""
        return self.table.flatten()

    def sample(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """n points [n, 2] drawn exactly from p_1."""
        idx = torch.multinomial(self.probs, int(n), replacement=True, generator=generator)
        return torch.stack([idx // self.width, idx % self.width], 1)

    def log_prob(self, x: Tensor) -> Tensor:
        """log p_1(x) for x [B, 2] (float64; −inf off the support)."""
        x = torch.as_tensor(x).long().cpu()
        return torch.log(self.table[x[:, 0], x[:, 1]])

    def left_restricted(self) -> Tensor:
        """p_1(· | x^0 < W/2) as a [W, W] table: the exact target of the reward fine-tuning demo."""
        t = self.table.clone()
        t[self.width // 2 :] = 0
        return t / t.sum()

    def right_mass(self) -> float:
        return float(self.table[self.width // 2 :].sum())


def histogram(x: Tensor, width: int) -> Tensor:
    """Empirical distribution [W, W] (float64) of points x [n, 2]."""
    x = torch.as_tensor(x).long().cpu()
    counts = torch.bincount(x[:, 0] * width + x[:, 1], minlength=width * width).double()
    return (counts / counts.sum().clamp_min(1)).reshape(width, width)


def right_fraction(x: Tensor, width: int) -> float:
    """Fraction of points in the right half (x^0 ≥ W/2)."""
    return float((torch.as_tensor(x)[:, 0] >= width // 2).double().mean())


def total_variation(p: Tensor, q: Tensor) -> float:
    """TV(p, q) = ½ Σ |p − q| over the grid."""
    return 0.5 * float((p.double() - q.double()).abs().sum())


def build_grid(
    width: int = 128,
    num_modes: int = 8,
    radius: float = 0.32,
    std: float = 1 / 40,
    seed: int = 0,
    num_train: int = 50_000,
    num_valid: int = 2_000,
    num_test: int = 2_000,
) -> DataBundle:
    """The `grid` data kind: i.i.d. points of the ring-of-Gaussians grid distribution, V = width, L = 2."""
    if int(num_train) < 1 or int(num_valid) < 0 or int(num_test) < 0:
        raise DataError("grid num_train must be >= 1 and num_valid, num_test >= 0")
    dist = GridDistribution(width, num_modes, radius, std)
    g = torch.Generator().manual_seed(int(seed))
    splits = [dist.sample(int(n), g).to(compact_dtype(dist.width)) for n in (num_train, num_valid, num_test)]
    probs = dist.probs[dist.probs > 0]
    entropy = float(-(probs * probs.log()).sum())
    return DataBundle(
        name="grid",
        vocab_size=dist.width,
        seq_len=2,
        train=splits[0],
        valid=splits[1],
        test=splits[2],
        tokenizer=_GridTokenizer(dist.width),
        nats_per_token_floor=entropy / 2,
        label=f"grid({dist.width}x{dist.width}, {dist.num_modes} modes)",
        source=dist,
        meta={"entropy_nats": entropy, "right_mass": dist.right_mass()},
    )


class _GridTokenizer:
    """Points print as "(x0,x1)"; there is no text to encode."""

    def __init__(self, width: int):
        self.vocab_size = int(width)

    def encode(self, text: str) -> list[int]:
        parts = text.strip("() ").split(",")
        return [int(p) for p in parts]

    def decode(self, ids) -> str:
        return "(" + ",".join(str(int(i)) for i in ids) + ")"
