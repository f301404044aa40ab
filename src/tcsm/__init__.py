"""tcsm: Target Concrete Score Matching for discrete diffusion models.

The public API a notebook needs, importable from the top level (resolved on first use, so `import tcsm` stays
cheap and no submodule is imported before it is asked for):

    import tcsm
    path = tcsm.MaskedPath(vocab_size=27, schedule=tcsm.LogLinearSchedule())
    objective = tcsm.Objective(path, loss="distrib")                 # L_distrib, κ_t weighting, data target
    loss, metrics = objective(model, x1, generator)                  # model: (x_t [B,L], t [B]) → logits [B,L,V]
    bound = tcsm.evaluate_bound(model, test, path)                   # valid NLL bound, bits per token
    x = tcsm.sample(model, path, batch_size=8, length=64, num_steps=64)
    ckpt = tcsm.load_checkpoint("runs/demo")                         # a trained run → .model, .build_path()
    tcsm.export("runs/demo", "hf/demo"); model = tcsm.from_pretrained("hf/demo")   # Hugging Face-style directory
    tcsm.Trainer.from_config(tcsm.load_config("synthetic"), "runs/demo").fit()
"""

from __future__ import annotations

import importlib

from tcsm.storage.migration import install_module_aliases

install_module_aliases()

__version__ = "0.1.0"

#: public name → the module that defines it
_EXPORTS = {
    # paths and schedules
    "ProbabilityPath": "tcsm.paths",
    "MaskedPath": "tcsm.paths",
    "UniformPath": "tcsm.paths",
    "make_path": "tcsm.paths",
    "LinearSchedule": "tcsm.paths.schedules",
    "CosineSchedule": "tcsm.paths.schedules",
    "PolynomialSchedule": "tcsm.paths.schedules",
    "LogLinearSchedule": "tcsm.paths.schedules",
    "make_schedule": "tcsm.paths.schedules",
    # the objective contract
    "Batch": "tcsm.core.batch",
    "Objective": "tcsm.objectives",
    "distrib_loss": "tcsm.objectives",
    "score_loss": "tcsm.objectives",
    "ScoreEntropyObjective": "tcsm.objectives.sedd",
    "Target": "tcsm.targets",
    "TargetBatch": "tcsm.targets",
    "DataTarget": "tcsm.targets",
    "ConditionalTarget": "tcsm.targets",
    "ParametricTarget": "tcsm.targets",
    "RewardN1Target": "tcsm.posttrain.reward.targets",
    "RewardFullTarget": "tcsm.posttrain.reward.targets",
    "BREGMAN": "tcsm.objectives.divergences",
    "F_DIVERGENCES": "tcsm.objectives.divergences",
    # likelihood and sampling
    "nelbo": "tcsm.evaluation.likelihood",
    "evaluate_bound": "tcsm.evaluation.likelihood",
    "sample": "tcsm.sampling",
    "may_cache": "tcsm.sampling",
    # models
    "Denoiser": "tcsm.models",
    "DenoiserConfig": "tcsm.models",
    "build_denoiser": "tcsm.models",
    "build_lm": "tcsm.models.lm_families",
    # configs, checkpoints, training
    "load_config": "tcsm.builders",
    "build_components": "tcsm.builders",
    "load_checkpoint": "tcsm.builders",
    "export": "tcsm.builders.export",
    "from_pretrained": "tcsm.builders.export",
    "Trainer": "tcsm.train",
    "fit": "tcsm.train",
}

__all__ = sorted(_EXPORTS)  # noqa: PLE0605 (one list of names: _EXPORTS)

#: old names, not in __all__: each reads through its old module path (tcsm.storage.migration, with a note)
_OLD_EXPORTS = {"build_clean_model": "tcsm.models.clean_families"}


def __getattr__(name: str):
    module = _EXPORTS.get(name) or _OLD_EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tcsm' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
