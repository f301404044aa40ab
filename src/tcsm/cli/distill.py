"""`tcsm distill`: the distillation recipe (`tcsm.recipes.distill`) as a top-level command, the same as
`tcsm finetune distill`."""

from __future__ import annotations

import argparse

HELP = "distil an autoregressive teacher into a diffusion student (exact / Top-K / Top-K+n-gram / Taylor; MATH.md §5.4)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from tcsm.cli.recipe import add_recipe_arguments
    from tcsm.recipes.spec import recipe

    spec = recipe("distill")
    p.description = spec.doc
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    add_recipe_arguments(p, spec)


def run(args) -> int:
    from tcsm.cli.recipe import run_recipe_spec
    from tcsm.recipes.spec import recipe

    return run_recipe_spec(args, recipe("distill"))
