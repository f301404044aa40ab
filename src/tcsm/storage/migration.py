"""Readers of what older versions wrote or named: module paths that moved into the layer folders, and saved configs
from before a model field existed. Every shim for an old name lives here and says, once, in one line, what the new
name is.

An old import (`import tcsm.likelihood`, `from tcsm.batch import Batch`) still works: a meta-path finder maps the old
module name to its new home (or, for a module that was split, to a view over its parts) and warns once."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

#: old module → the module(s) that now hold its names, searched in order.
MOVED_MODULES: dict[str, tuple[str, ...]] = {
    "tcsm.batch": ("tcsm.core.batch",),
    "tcsm.protocols": ("tcsm.core.protocols",),
    "tcsm.errors": ("tcsm.core.errors",),
    "tcsm.progress": ("tcsm.core.progress",),
    "tcsm.fileio": ("tcsm.storage.fileio",),
    "tcsm.checkpoint": ("tcsm.storage.checkpoint",),
    "tcsm.schedules": ("tcsm.paths.schedules",),
    "tcsm.timesteps": ("tcsm.paths.timesteps",),
    "tcsm.divergences": ("tcsm.objectives.divergences",),
    "tcsm.baselines": ("tcsm.objectives.sedd",),
    "tcsm.clean_losses": ("tcsm.objectives.clean_lm",),
    "tcsm.toy": ("tcsm.evaluation.exact",),
    "tcsm.likelihood": ("tcsm.evaluation.likelihood", "tcsm.core.results", "tcsm.paths.bounds"),
    "tcsm.posttrain.preference.pairs": ("tcsm.data.pairs",),
    "tcsm.posttrain.sft.data": ("tcsm.data.sft",),
    "tcsm.builders.sampler": ("tcsm.sampling.settings",),
    **{f"tcsm.posttrain.{m}.builder": (f"tcsm.recipes.{m}.builder",) for m in ("dre", "preference", "reward", "sft", "distill")},
    **{f"tcsm.posttrain.{m}.recipe": (f"tcsm.recipes.{m}.compose",) for m in ("dre", "preference", "reward", "sft", "distill")},
}


class _Moved(importlib.abc.Loader):
    def __init__(self, old: str, homes: tuple[str, ...]):
        self.old, self.homes = old, homes

    def create_module(self, spec):
        warnings.warn(f"{self.old} moved to {' + '.join(self.homes)}; import it from there", DeprecationWarning, stacklevel=2)
        modules = [importlib.import_module(h) for h in self.homes]
        if len(modules) == 1:
            return modules[0]
        view = types.ModuleType(self.old, f"{self.old}: the names of {', '.join(self.homes)}")

        def __getattr__(name):
            for m in modules:
                if hasattr(m, name):
                    return getattr(m, name)
            raise AttributeError(f"module {self.old!r} has no attribute {name!r}")

        view.__getattr__ = __getattr__
        return view

    def exec_module(self, module) -> None:
        pass


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        homes = MOVED_MODULES.get(fullname)
        return importlib.util.spec_from_loader(fullname, _Moved(fullname, homes)) if homes else None


def install_module_aliases() -> None:
    """Let old module paths import (idempotent); called when `tcsm` is imported."""
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())


def migrate_saved_config(config: dict | None) -> None:
    """Saved configs from before a model field existed get the value those models were trained with, so that
    they rebuild the same function rather than the new default."""
    model = config.get("model") if isinstance(config, dict) else None
    if not isinstance(model, dict):
        return
    # An energy run's config describes its reference denoiser too.
    for node in (model, model.get("reference_model")):
        is_denoiser = isinstance(node, dict) and node and node.get("name", "denoiser") == "denoiser"  # its schema
        if is_denoiser and "activation" not in node:
            node["activation"] = "gelu_tanh"  # the denoiser's MLP before `activation` (default now exact GELU)
