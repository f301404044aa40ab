"""`Parts`, the one name → part table: registered classes (samplers' kin: exporters, RL estimators, rewards) and the
math layers' tables (losses, divergences, weightings, paths, ...)."""

from __future__ import annotations

import pytest

from tcsm.core.parts import Parts
from tcsm.objectives.divergences import BREGMAN, get_bregman, get_f_divergence
from tcsm.objectives.losses import get_loss
from tcsm.objectives.weighting import get_weighting
from tcsm.paths import make_path, make_schedule


def test_lookup_register_and_pass_through():
    table = Parts("colour", {"red": 1}, passes=callable)

    @table.register("blue")
    def blue():
        return 2

    assert table.lookup("red") == 1 and table.lookup("blue") is blue
    assert table.lookup(print) is print  # an object of the table's kind passes through
    with pytest.raises(ValueError) as e:
        table.lookup("green")
    assert str(e.value) == "unknown colour 'green'; choose one of ['blue', 'red']"
    with pytest.raises(ValueError, match="unknown colour"):
        Parts("colour", {"red": 1}).lookup(print)  # no pass-through unless the table says so


def test_a_class_registers_under_its_name_and_homes_load_on_first_use():
    table = Parts("widget", homes=("tcsm.rewards.functions",))

    @table.register
    class Knob:
        name = "knob"

    assert table.get("knob") is Knob and table.names() == ("knob",)
    with pytest.raises(ValueError, match="already registered"):
        table.register(type("Other", (), {"name": "knob"}))
    with pytest.raises(ValueError, match="empty"):
        table.register(type("Nameless", (), {}))
    from tcsm.rewards.functions import REWARDS

    assert {"grid", "vader", "profanity", "hf", "task", "python"} <= set(REWARDS)  # the rewards are parts too


def test_the_old_module_name_still_imports_with_a_warning(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "tcsm.core.names", raising=False)  # warned once per process
    with pytest.warns(DeprecationWarning, match="tcsm.core.names moved to tcsm.core.parts"):
        from tcsm.core.names import NameTable
    assert NameTable is Parts


@pytest.mark.parametrize("lookup", [get_loss, get_bregman, get_f_divergence, get_weighting, make_schedule,
                                    lambda name: make_path(name, 4)])  # fmt: skip
def test_every_lookup_fails_in_one_line_that_lists_the_choices(lookup):
    with pytest.raises(ValueError) as e:
        lookup("no-such-name")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("unknown ") and "choose one of [" in msg


def test_bregman_passes_a_generator_instance_through():
    g = BREGMAN["gkl"]
    assert get_bregman(g) is g and get_bregman("kl") is g
