"""`NameTable`, the one name → object lookup of the math layers (losses, divergences, weightings, paths, ...)."""

from __future__ import annotations

import pytest

from tcsm.core.names import NameTable
from tcsm.objectives.divergences import BREGMAN, get_bregman, get_f_divergence
from tcsm.objectives.losses import get_loss
from tcsm.objectives.weighting import get_weighting
from tcsm.paths import make_path, make_schedule


def test_lookup_register_and_pass_through():
    table = NameTable("colour", {"red": 1}, passes=callable)

    @table.register("blue")
    def blue():
        return 2

    assert table.lookup("red") == 1 and table.lookup("blue") is blue
    assert table.lookup(print) is print  # an object of the table's kind passes through
    with pytest.raises(ValueError) as e:
        table.lookup("green")
    assert str(e.value) == "unknown colour 'green'; choose one of ['blue', 'red']"
    with pytest.raises(ValueError, match="unknown colour"):
        NameTable("colour", {"red": 1}).lookup(print)  # no pass-through unless the table says so


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
