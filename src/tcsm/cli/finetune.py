"""`tcsm finetune <recipe>`: post-train a pre-trained run; one module per recipe, registered in `RECIPES`.

A recipe module defines `HELP`, `add_arguments(parser)` and `run(args) -> int`, like a command (tcsm.cli).
Every recipe is an ordinary run of the one Trainer: same checkpoints, --resume, logs and one-line errors. An
existing run directory is refused by the Trainer unless resumed; `--overwrite` (added to every recipe here)
replaces it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

HELP = "post-train a pre-trained checkpoint (reward, ...: see tcsm finetune --help)"

#: recipe name → module implementing it
RECIPES: dict[str, str] = {
    "reward": "tcsm.cli.finetune_reward",
    "dre": "tcsm.cli.finetune_dre",
    "preference": "tcsm.cli.finetune_preference",
    "sft": "tcsm.cli.finetune_sft",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="recipe", metavar="<recipe>", parser_class=type(p))
    for name, module_name in RECIPES.items():
        module = importlib.import_module(module_name)
        r = sub.add_parser(name, help=module.HELP, description=module.__doc__)
        module.add_arguments(r)
        if "--overwrite" not in r._option_string_actions:
            from tcsm.cli.common import add_overwrite_argument

            add_overwrite_argument(r)
        r.set_defaults(_recipe_run=module.run)


def run(args) -> int:
    if getattr(args, "recipe", None) is None:
        print(f"tcsm finetune: error: choose a recipe: {' | '.join(RECIPES)} (see tcsm finetune --help)", file=sys.stderr)
        return 2
    from tcsm.cli.common import check_overwrite

    check_overwrite(args)
    return int(args._recipe_run(args) or 0)
