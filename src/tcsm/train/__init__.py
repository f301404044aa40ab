"""Training: one Trainer for every objective, pickle-free checkpoints, run configs, DDP.

cfg = load_config("synthetic", ["train.steps=500"])   # preset + key=value overrides, validated
Trainer(cfg, "runs/demo").fit()
ckpt = load_checkpoint("runs/demo")                    # .model (EMA weights), .config, .build_path()
"""

from tcsm.train.checkpoint import LoadedCheckpoint, load_checkpoint, save_checkpoint
from tcsm.train.config import RunConfig, load_config
from tcsm.train.trainer import Trainer

__all__ = ["LoadedCheckpoint", "RunConfig", "Trainer", "load_checkpoint", "load_config", "save_checkpoint"]
