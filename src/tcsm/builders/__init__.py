"""The build layer: configuration and checkpoints → objects (models, targets, objectives, run components).

Everything that reads a config section or a checkpoint directory to make an object lives here; the math
modules, models and data below it take objects only, and the trainer, recipes and CLI above it call these.

    cfg = load_config("synthetic", ["train.steps=500"])     # preset + key=value overrides, validated
    parts = build_components(cfg, torch.device("cpu"))       # data → path → model → target → objective
    ckpt = load_checkpoint("runs/demo")                      # .model (EMA weights), .config, .build_path()
"""

from tcsm.builders.assemble import build_components
from tcsm.builders.components import Components, DataInfo, build_data, build_path
from tcsm.builders.config import load_config
from tcsm.builders.loading import LoadedCheckpoint, load_checkpoint
from tcsm.builders.registry import MODELS, OBJECTIVES, TARGETS, BuildContext
from tcsm.builders.schema import RunConfig

__all__ = [
    "MODELS",
    "OBJECTIVES",
    "TARGETS",
    "BuildContext",
    "Components",
    "DataInfo",
    "LoadedCheckpoint",
    "RunConfig",
    "build_components",
    "build_data",
    "build_path",
    "load_checkpoint",
    "load_config",
]
