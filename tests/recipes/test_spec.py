"""One spec per post-training recipe (DESIGN.md "Where a new post-training method goes"): each flag is a config key
of the recipe's schema (so a renamed key breaks here), the commands built from the specs offer every flag the
hand-written commands offered (flags_before.json, recorded from them), and the recipes are found by listing
`tcsm.recipes`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tcsm.builders.config import load_config
from tcsm.cli.recipe import add_recipe_arguments
from tcsm.recipes.spec import all_recipes, flag_field, recipe, recipe_of

BEFORE = json.loads((Path(__file__).parent / "flags_before.json").read_text())
NAMES = ["distill", "dre", "preference", "reward", "sft"]


def test_the_recipes_are_the_folders():
    assert [s.name for s in all_recipes()] == sorted([*NAMES, "rl", "fewstep"])  # rl, fewstep came after the recorded flags


@pytest.mark.parametrize("name", NAMES)
def test_every_flag_is_a_field_of_the_schema(name):
    spec = recipe(name)
    for flag in spec.flags:
        field, _ = flag_field(spec, flag)
        assert field.name == flag.key.rsplit(".", 1)[1]
    cfg = load_config(spec.preset)
    section, key = spec.marks[0].split(".")
    assert cfg[section][key] == spec.marks[1] and recipe_of(cfg) is spec


def _options(parser) -> dict:
    out = {}
    for a in parser._actions:
        if a.option_strings and "-h" not in a.option_strings:
            out[tuple(sorted(a.option_strings))] = a
    return out


@pytest.mark.parametrize("name", NAMES)
def test_the_command_offers_every_flag_it_offered(name):
    spec = recipe(name)
    p = argparse.ArgumentParser()
    add_recipe_arguments(p, spec)
    now = _options(p)
    command = " ".join(spec.words)
    for row in BEFORE[command].values():
        match = [a for opts, a in now.items() if set(row["options"]) <= set(opts)]
        assert match, f"{command}: {row['options']} is gone"
        a = match[0]
        assert (list(a.choices) if a.choices else None) == row["choices"], (command, row)
        assert getattr(a.type, "__name__", None) == row["type"], (command, row)
        assert isinstance(a, argparse._StoreTrueAction) == row["store_true"], (command, row)
        if row["default"] is not None:
            assert a.default == row["default"], (command, row)


def test_a_flag_naming_no_key_of_the_schema_fails():
    from dataclasses import replace

    from tcsm.recipes.spec import Flag

    spec = replace(recipe("reward"), flags=(Flag("target.no_such_key"),))
    with pytest.raises(KeyError, match="no_such_key"):
        add_recipe_arguments(argparse.ArgumentParser(), spec)


@pytest.mark.parametrize("name", NAMES)
def test_every_flag_takes_its_help_from_the_schema(name):
    """A flag's help is its schema field's `help` metadata (a data kind's: its builder's Annotated parameter)."""
    spec = recipe(name)
    for flag in spec.flags:
        field, _ = flag_field(spec, flag)
        assert field.metadata.get("help"), f"{flag.key} has no help in its schema"


@pytest.mark.parametrize("words", [*(("finetune", n) for n in NAMES), ("distill",)])
def test_help_lists_every_flag_it_listed(words, capsys):
    """`tcsm <words> --help` (what a person reads) names every option string the hand-written commands had."""
    from tcsm.cli import main

    with pytest.raises(SystemExit) as exit_:
        main([*words, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    before = BEFORE[" ".join(words) if words != ("finetune", "distill") else "distill"]
    for row in before.values():
        for option in row["options"]:
            assert option in text, f"tcsm {' '.join(words)} --help does not list {option}"


def test_the_distill_command_and_finetune_distill_are_one_spec(monkeypatch):
    """`tcsm distill` and `tcsm finetune distill` parse the same flags into the same run (one spec)."""
    import tcsm.cli.recipe as recipe_cli
    from tcsm.cli import main

    seen = []
    monkeypatch.setattr(recipe_cli, "run_recipe_spec", lambda args, spec: seen.append((spec, args.k)) or 0)
    for words in (("distill",), ("finetune", "distill")):
        assert main([*words, "--teacher", "T", "-k", "3"]) == 0
    assert seen == [(recipe("distill"), 3)] * 2
