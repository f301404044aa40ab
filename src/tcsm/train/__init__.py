"""Training: one Trainer for every objective (AdamW, EMA, bf16, DDP, exact resume) and `fit`.

cfg = load_config("synthetic", ["train.steps=500"])        # tcsm.builders: preset + key=value overrides
Trainer.from_config(cfg, "runs/demo").fit()                # or Trainer(components, cfg, run_dir)
fit(cfg, "runs/demo")                                      # the same, under torchrun too, + summary.json
"""

from tcsm.train.fit import fit
from tcsm.train.trainer import Trainer

__all__ = ["Trainer", "fit"]
