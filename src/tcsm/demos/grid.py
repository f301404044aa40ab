"""The paper's 2-D grid reward experiment (App. E, `fig:grid_samples`) as one function, `run_grid_demo`.

1. Pre-train a denoiser on the W × W grid distribution (`data.kind: grid`, preset `demo-grid`): uniform source,
   L_distrib, the shared `Trainer`.
2. Fine-tune it toward p^R ∝ p_1 e^{R/β} with R = 0 on the left half and −10^5 on the right (preset
   `finetune-grid`: N^full self-normalised importance weights, MATH.md §5.2), again with the `Trainer`.
3. Sample both models with the analytic sampler (MATH.md §6.2), keep intermediate states, and write
   `grid_dynamics.png` (2-D histograms at several sampling steps, before and after) and `metrics.json`
   (right-half fraction before/after, TV of the after-samples to p_1 restricted to the left half, with the TV
   an exact sample of the same size would get, so the number can be read).

Also registers `model.name: grid_mlp`, a small MLP denoiser for very short sequences: on L = 2 a transformer
buys nothing and costs several times more CPU time.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from tcsm.builders.registry import MODELS

__all__ = ["SIZES", "GridMLP", "evaluate_grid", "plot_dynamics", "run_grid_demo"]


class GridMLP(nn.Module):
    """x_t [B, L] (ids < num_states), t [B] → logits [B, L, V]: token embeddings ⊕ Fourier features of t → MLP.

    Every output position sees the whole x_t and t, as a denoiser of p_{1|t} must (MATH.md §1.3).
    """

    def __init__(
        self,
        vocab_size: int,
        num_states: int,
        seq_len: int,
        d_embed: int = 64,
        hidden: int = 256,
        n_layers: int = 3,
        time_features: int = 8,
    ):
        super().__init__()
        self.vocab_size, self.seq_len, self.time_features = int(vocab_size), int(seq_len), int(time_features)
        self.embed = nn.Embedding(int(num_states), int(d_embed))
        layers: list[nn.Module] = []
        width = self.seq_len * int(d_embed) + 2 * self.time_features + 1
        for _ in range(int(n_layers)):
            layers += [nn.Linear(width, int(hidden)), nn.SiLU()]
            width = int(hidden)
        layers.append(nn.Linear(width, self.seq_len * self.vocab_size))
        self.net = nn.Sequential(*layers)

    def forward(self, xt: Tensor, t: Tensor) -> Tensor:
        if xt.shape[1] != self.seq_len:
            raise ValueError(
                f"grid_mlp was built for length {self.seq_len}, got sequences of length {xt.shape[1]}"
            )
        t = t.float().reshape(-1, 1)
        freq = torch.arange(1, self.time_features + 1, device=xt.device, dtype=torch.float32) * math.pi
        feats = torch.cat([t, torch.sin(freq * t), torch.cos(freq * t)], dim=-1)
        h = torch.cat([self.embed(xt).flatten(1), feats], dim=-1)
        return self.net(h).float().view(xt.shape[0], self.seq_len, self.vocab_size)


@dataclass
class GridMLPConfig:
    name: str = "grid_mlp"
    d_embed: int = 64
    hidden: int = 256
    n_layers: int = 3
    time_features: int = 8


@MODELS.register("grid_mlp", schema=GridMLPConfig, overwrite=True)
def build_grid_mlp(node: dict, ctx) -> GridMLP:
    """MLP denoiser for short sequences (the grid demo; L = 2)."""
    return GridMLP(ctx.vocab_size, ctx.path.num_states, ctx.seq_len, **node)


# --------------------------------------------------------------------------------------------------- demo

#: Overrides of the two presets per demo size. "test" is what the test suite runs (seconds on 2 cores).
SIZES: dict[str, dict[str, list[str]]] = {
    "full": {"pretrain": [], "finetune": []},
    "test": {
        "pretrain": [
            "data.width=32",
            "data.num_train=20000",
            "model.hidden=128",
            "train.steps=300",
            "train.batch_size=128",
            "train.eval_examples=256",
        ],
        "finetune": [
            "train.steps=80",
            "train.batch_size=32",
            "target.pool_size=512",
            "target.sample_steps=16",
            "target.refresh_every=40",
        ],
    },
}


def _hist(x: Tensor, width: int) -> Tensor:
    from tcsm.data.grid import histogram

    return histogram(x, width)


def _coarse(h: Tensor, block: int) -> Tensor:
    W = h.shape[0]
    return h.reshape(W // block, block, W // block, block).sum((1, 3))


def evaluate_grid(dist, before: Tensor, after: Tensor, generator: torch.Generator, block: int = 8) -> dict:
    """Right-half fractions and total variations of the samples (MATH.md §5.2's target p^R = p_1(· | left))."""
    from tcsm.data.grid import right_fraction, total_variation

    W, n = dist.width, after.shape[0]
    left = dist.left_restricted()
    # Reference: an exact sample of the same size — its TV is the floor set by the finite sample alone.
    exact = torch.multinomial(left.flatten(), n, replacement=True, generator=generator)
    exact = torch.stack([exact // W, exact % W], 1)
    exact_full = dist.sample(n, generator)
    block = block if W % block == 0 else 1
    h_after, h_exact, h_before = _hist(after, W), _hist(exact, W), _hist(before, W)
    return {
        "right_fraction_data": dist.right_mass(),
        "right_fraction_before": right_fraction(before, W),
        "right_fraction_after": right_fraction(after, W),
        "tv_after_to_left_data": total_variation(h_after, left),
        "tv_exact_sample_to_left_data": total_variation(h_exact, left),
        f"tv_after_to_left_data_{block}x{block}_bins": total_variation(
            _coarse(h_after, block), _coarse(left, block)
        ),
        f"tv_exact_sample_to_left_data_{block}x{block}_bins": total_variation(
            _coarse(h_exact, block), _coarse(left, block)
        ),
        "tv_before_to_data": total_variation(h_before, dist.table),
        "tv_exact_sample_to_data": total_variation(_hist(exact_full, W), dist.table),
    }


def plot_dynamics(
    out: Path,
    width: int,
    times: list[float],
    before: dict[int, Tensor],
    after: dict[int, Tensor],
    data_tables: tuple[Tensor, Tensor],
    metrics: dict,
) -> None:
    """Two rows (before / after fine-tuning) of 2-D sample histograms at the recorded sampling steps, plus the
    target distributions (p_1 and p_1 restricted to the left half) in the last column."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted(before)
    cols = len(steps) + 1
    fig, axes = plt.subplots(2, cols, figsize=(2.3 * cols, 5.3), squeeze=False)
    rows = (("pre-trained", before, data_tables[0]), ("fine-tuned", after, data_tables[1]))
    for r, (label, traj, table) in enumerate(rows):
        for c, k in enumerate(steps):
            ax = axes[r][c]
            ax.imshow(
                _hist(traj[k], width).T.numpy(), origin="lower", cmap="viridis", interpolation="nearest"
            )
            ax.set_title(f"t = {times[k]:.2f}", fontsize=9)
        ax = axes[r][-1]
        ax.imshow(table.T.numpy(), origin="lower", cmap="viridis", interpolation="nearest")
        ax.set_title("p_1" if r == 0 else "p_1 | left half", fontsize=9)
        axes[r][0].set_ylabel(label, fontsize=10)
        for ax in axes[r]:
            ax.set_xticks([])
            ax.set_yticks([])
            ax.axvline(width / 2 - 0.5, color="white", lw=0.5, alpha=0.6)
    fig.suptitle(
        f"{width}×{width} grid, R = 0 (left) / −1e5 (right): right-half fraction "
        f"{metrics['right_fraction_before']:.3f} → {metrics['right_fraction_after']:.4f}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _fit(cfg, run_dir: Path, log) -> float:
    """Train (or finish) the run in run_dir with the shared Trainer; returns the wall time of this call."""
    from tcsm.train.fit import fit

    start = time.perf_counter()
    fit(cfg, run_dir, resume=True if (run_dir / "checkpoints").is_dir() else None, log=log)
    return time.perf_counter() - start


def run_grid_demo(
    out_dir: str | Path,
    *,
    size: str = "full",
    pretrain_overrides: list[str] | tuple[str, ...] = (),
    finetune_overrides: list[str] | tuple[str, ...] = (),
    num_samples: int = 20_000,
    sample_steps: int = 64,
    snapshots: int = 5,
    seed: int = 0,
    log=print,
) -> dict:
    """Pre-train, fine-tune, sample and plot (see the module docstring); returns the metrics dict.

    Runs resume: a second call with the same `out_dir` reuses finished training runs.
    """
    from tcsm.builders.config import load_config
    from tcsm.builders.loading import load_checkpoint
    from tcsm.recipes.reward.compose import reward_config
    from tcsm.sampling.settings import draw, sample_settings

    if size not in SIZES:
        raise ValueError(f"unknown demo size {size!r}; choose one of {sorted(SIZES)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    wall = {}
    pre_cfg = load_config("demo-grid", [*SIZES[size]["pretrain"], *pretrain_overrides])
    log(
        f"[1/3] pre-training on the {pre_cfg.data.width}×{pre_cfg.data.width} grid ({pre_cfg.train.steps} steps)"
    )
    wall["pretrain_s"] = _fit(pre_cfg, out / "pretrain", log)
    ft_cfg = reward_config(out / "pretrain", "finetune-grid", [*SIZES[size]["finetune"], *finetune_overrides])
    log(
        f"[2/3] reward fine-tuning, N^full with B={ft_cfg.target.num_proposals}, β={ft_cfg.target.beta} "
        f"({ft_cfg.train.steps} steps)"
    )
    wall["finetune_s"] = _fit(ft_cfg, out / "finetune", log)

    log(f"[3/3] sampling {num_samples} points from each model ({sample_steps} steps)")
    start = time.perf_counter()
    pre = load_checkpoint(out / "pretrain")
    post = load_checkpoint(out / "finetune")
    path = pre.build_path()
    data = pre.build_data()
    dist = data.source
    record = sorted({round(k * sample_steps / (snapshots - 1)) for k in range(snapshots)})
    trajectories, finals = [], []
    for ck in (pre, post):
        g = torch.Generator().manual_seed(seed)
        settings = sample_settings(ck.config.sample, steps=sample_steps)
        x, stats = draw(ck.model, path, num_samples, 2, settings, generator=g, record_steps=record, chunk_size=4096)
        trajectories.append(stats.trajectory)
        finals.append(x)
    times = stats.times.tolist()
    metrics = evaluate_grid(dist, finals[0], finals[1], torch.Generator().manual_seed(seed + 1))
    wall["sample_eval_s"] = time.perf_counter() - start
    metrics.update(
        width=dist.width,
        num_samples=num_samples,
        sampler={"method": stats.method, "steps": sample_steps},
        size=size,
        beta=float(ft_cfg.target.beta),
        num_proposals=int(ft_cfg.target.num_proposals),
        pretrain_steps=int(pre_cfg.train.steps),
        finetune_steps=int(ft_cfg.train.steps),
        wall_time_s={k: round(v, 1) for k, v in wall.items()},
        torch_threads=torch.get_num_threads(),
    )
    plot_dynamics(
        out / "grid_dynamics.png",
        dist.width,
        times,
        trajectories[0],
        trajectories[1],
        (dist.table, dist.left_restricted()),
        metrics,
    )
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n", encoding="utf-8")
    return metrics
