"""builders/registry.py: a name finds its entry (the built-in homes imported first), a `module:function` name is
used without registration, and every way to ask for something that is not there is a one-line ConfigError that
lists the choices; the recipes' builders are found by listing the recipes package."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass

import pytest

from tcsm.builders.registry import (
    BUILDER_MODULES,
    FAMILY_MODULES,
    MODELS,
    OBJECTIVES,
    TARGETS,
    BuildContext,
    Registry,
    family_of_name,
    import_plugins,
    model_families,
)
from tcsm.core.errors import ConfigError
from tcsm.models.kinds import DENOISER, UNDECLARED, ModelKind


@dataclass
class ToySchema:
    width: int = 3


def test_register_get_build_and_the_entrys_help():
    reg = Registry("widget")

    @reg.register("toy", schema=ToySchema)
    def build_toy(node, ctx):
        """A toy widget.

        More text the help does not show."""
        return ("toy", node["width"], ctx)

    entry = reg.get("toy")
    assert entry.builder is build_toy and entry.schema is ToySchema and entry.help == "A toy widget."
    assert reg.build("toy", {"width": 5}, "ctx") == ("toy", 5, "ctx")
    assert "toy" in reg and reg.names() == ["toy"]
    reg.register("plain", lambda node, ctx: 1, help="given help")
    assert reg.get("plain").help == "given help" and reg.names() == ["plain", "toy"]


def test_a_second_builder_under_one_name_needs_overwrite():
    reg = Registry("widget")
    first = reg.register("toy", lambda node, ctx: 1)
    reg.register("toy", first)  # the same builder again (a module imported twice) is fine
    with pytest.raises(ValueError, match="widget 'toy' is already registered; pass overwrite=True"):
        reg.register("toy", lambda node, ctx: 2)
    reg.register("toy", lambda node, ctx: 2, overwrite=True)
    assert reg.build("toy", {}, None) == 2


def test_an_unknown_name_is_one_line_with_the_choices():
    reg = Registry("widget")
    reg.register("a", lambda node, ctx: 1)
    with pytest.raises(ConfigError) as e:
        reg.get("b")
    assert str(e.value) == "unknown widget 'b'; choose one of ['a'] or give 'module:function'"


def test_the_homes_are_imported_once_before_a_name_is_called_unknown(tmp_path, monkeypatch):
    """A home registers its entries when imported (as the builder modules do); nothing is imported up front."""
    reg = Registry("widget", homes=("toy_widget_home",))
    monkeypatch.setitem(sys.modules, "toy_widget_registry", types.SimpleNamespace(REG=reg))
    (tmp_path / "toy_widget_home.py").write_text(
        "import toy_widget_registry\n"
        "toy_widget_registry.REG.register('late', lambda node, ctx: 'late')\n"
        "IMPORTS = globals().get('IMPORTS', 0) + 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "toy_widget_home", raising=False)
    assert "toy_widget_home" not in sys.modules
    assert reg.build("late", {}, None) == "late"
    with pytest.raises(ConfigError, match=r"^unknown widget 'other'; choose one of \['late'\]"):
        reg.get("other")
    assert sys.modules["toy_widget_home"].IMPORTS == 1


def test_a_module_function_name_is_used_without_registration(monkeypatch):
    module = types.ModuleType("toy_widgets")

    def build_user(node, ctx):
        """A user's widget."""
        return node

    build_user.schema = ToySchema
    module.build_user = build_user
    monkeypatch.setitem(sys.modules, "toy_widgets", module)
    entry = Registry("widget").get("toy_widgets:build_user")
    assert entry.builder is build_user and entry.schema is ToySchema and entry.help == "A user's widget."
    for bad in ("toy_widgets:missing", "no_such_module_xyz:f"):
        with pytest.raises(ConfigError, match=rf"^cannot import widget builder '{bad}': ") as e:
            Registry("widget").get(bad)
        assert "\n" not in str(e.value)


def test_the_built_in_registries_hold_the_shipped_names_and_find_the_recipes_by_listing():
    assert {"denoiser", "hf_denoiser", "energy", "diffusion_gemma", "hf_masked_dlm"} <= set(MODELS.names())
    assert {"data", "parametric"} <= set(TARGETS.names())
    assert {"tcsm", "lm", "dre", "preference", "grpo"} <= set(OBJECTIVES.names())
    recipes = [m for m in BUILDER_MODULES if m.startswith("tcsm.recipes.")]
    assert recipes == sorted(recipes) and "tcsm.recipes.dre.builder" in recipes and "tcsm.recipes.rl.builder" in recipes
    assert all(m.endswith(".builder") for m in recipes)


def test_a_plugin_that_does_not_import_is_one_line():
    import_plugins(None)
    import_plugins(["json"])
    with pytest.raises(ConfigError, match=r"^cannot import plugin module 'no_such_plugin_xyz': "):
        import_plugins(["no_such_plugin_xyz"])


def test_the_build_context_reads_the_datas_sizes():
    ctx = BuildContext(config=None, data=types.SimpleNamespace(vocab_size=7.0, seq_len=12))
    assert (ctx.vocab_size, ctx.seq_len) == (7, 12) and ctx.extras == {} and ctx.reference is None


def test_a_model_entry_declares_the_kind_its_name_builds(monkeypatch):
    kind = ModelKind("mlm", "none", None, "a toy LM", "nll")
    monkeypatch.setattr(MODELS, "_entries", dict(MODELS._entries))  # the registration stays in this test
    MODELS.register("toy_lm", lambda node, ctx: None, kind=kind)
    assert family_of_name("toy_lm") is kind and model_families()["toy_lm"] is kind
    MODELS.register("toy_plain", lambda node, ctx: None)  # declares nothing: a denoiser, and in no family table
    assert family_of_name("toy_plain") is UNDECLARED and "toy_plain" not in model_families()
    assert family_of_name(None) is DENOISER and family_of_name("no_such_model") is UNDECLARED


def test_every_family_module_is_a_home_of_the_model_registry():
    assert set(FAMILY_MODULES) <= set(MODELS.homes) and set(FAMILY_MODULES) <= set(BUILDER_MODULES)
