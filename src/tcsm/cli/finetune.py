"""`tcsm finetune <recipe>`: post-train a pre-trained run, one subcommand per recipe of `tcsm.recipes` (its spec
declares its flags, preset, composition and report; `tcsm.cli.recipe` turns the spec into a command).

Every recipe is an ordinary run of the one Trainer: same checkpoints, --resume, logs and one-line errors. An
existing run directory is refused by the Trainer unless resumed; `--overwrite` replaces it.
"""

from __future__ import annotations

import argparse
import sys

HELP = "post-train a pre-trained checkpoint (reward, ...: see tcsm finetune --help)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from tcsm.cli.recipe import add_recipe_arguments, run_recipe_spec
    from tcsm.recipes.spec import all_recipes

    sub = p.add_subparsers(dest="recipe", metavar="<recipe>", parser_class=type(p))
    for spec in all_recipes():
        r = sub.add_parser(spec.name, help=spec.help, description=spec.doc,
                           formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
        add_recipe_arguments(r, spec)
        r.set_defaults(_recipe_run=lambda args, spec=spec: run_recipe_spec(args, spec))


def run(args) -> int:
    if getattr(args, "recipe", None) is None:
        from tcsm.recipes.spec import all_recipes

        names = " | ".join(s.name for s in all_recipes())
        print(f"tcsm finetune: error: choose a recipe: {names} (see tcsm finetune --help)", file=sys.stderr)
        return 2
    return int(args._recipe_run(args) or 0)
