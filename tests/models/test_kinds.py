"""Models declare what they are (DESIGN.md "capabilities are declared, not probed"): every model class carries a
`kind` (family, sampler, export), each config model name's registry entry declares the kind it builds
(`model_families`), and no code outside the models' own packages asks a model's class or compares a family name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from train_helpers import restore_torch_threads  # noqa: F401

from tcsm.builders.registry import family_of_name, model_families
from tcsm.models import Denoiser, DenoiserConfig
from tcsm.models.causal import CausalLM
from tcsm.models.hollow import HollowTransformer
from tcsm.models.kinds import DENOISER, UNDECLARED, ModelKind, kind_of
from tcsm.models.lm_families import build_lm
from tcsm.models.mlm import MaskedLM
from tcsm.posttrain.dre.energy import EnergyModel

SRC = Path(__file__).resolve().parents[2] / "src" / "tcsm"
FAMILIES = model_families()
#: where a model's own class and family names may be named: the models and their builder (an HF denoiser's
#: `kind: mlm | causal` is its config's), the energy model's method folder, the readers of old configs
OWN = ("models/", "builders/models.py", "posttrain/dre/", "storage/migration.py")
#: family names that are only family names ("energy" and "hf_denoiser" are also `tcsm export`'s kinds, which the
#: exporter dispatches on by design)
FAMILY_NAMES = {"mlm", "causal", "hollow", "hf_mlm", "hf_causal"}


def test_every_family_declares_every_field():
    for name, kind in FAMILIES.items():
        assert isinstance(kind, ModelKind) and kind.family and kind.description, name
        assert kind.sampler in ("path", "blocks", "left_to_right", "sir", "none"), name
        assert kind.export in (None, "denoiser", "hf_denoiser", "energy", "diffusion_gemma", "hf_masked_dlm"), name
        assert kind.likelihood in ("bound", "nll", "estimate"), name
        assert kind.is_denoiser == (kind.sampler in ("path", "blocks")), name
        assert kind.blocks == (kind.sampler == "blocks"), name
    # tcsm's own denoiser by default; a user's model that declares nothing is a denoiser that offers nothing more
    assert family_of_name(None) is DENOISER and family_of_name("a.plugin:model") is UNDECLARED
    assert "positions" in DENOISER.offers and not UNDECLARED.offers and UNDECLARED.is_denoiser


def test_each_model_class_answers_what_the_special_cases_answered():
    denoiser = Denoiser(DenoiserConfig(vocab_size=5, num_states=6, max_len=4, d_model=16, n_layers=1, n_heads=2))
    assert kind_of(denoiser) is DENOISER and kind_of(denoiser).export == "denoiser"
    for family, sampler in (("mlm", "none"), ("causal", "left_to_right"), ("hollow", "none")):
        model = build_lm(family, "tiny", vocab_size=5, max_len=4)
        assert (kind_of(model).family, kind_of(model).sampler, kind_of(model).export) == (family, sampler, None)
    energy = EnergyModel.model_kind  # the class declares it; building one needs a trained reference
    assert (energy.family, energy.sampler, energy.export) == ("energy", "sir", "energy")
    # wrappers (torch.compile, DDP) answer for the model inside; a bare callable is a denoiser that offers nothing
    assert kind_of(torch.nn.Module()) is UNDECLARED and kind_of(lambda x, t: x) is UNDECLARED
    wrapped = torch.nn.Module()
    wrapped._orig_mod = build_lm("causal", "tiny", vocab_size=5, max_len=4)
    assert kind_of(wrapped).family == "causal"


#: classes whose isinstance checks stand in for a model's declaration
MODEL_CLASSES = {"EnergyModel", "EnergyObjective", "HFDenoiser", "Denoiser", "MaskedLM", "CausalLM", "HollowTransformer"}


def _offences(path: Path) -> list[str]:
    """Each place in `path` that asks what a model is instead of `kind_of(model)`."""
    rel = path.relative_to(SRC).as_posix()
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            names = {getattr(n, "id", getattr(n, "attr", None)) for n in ast.walk(node.args[1])}
            if names & MODEL_CLASSES:
                out.append(f"{rel}:{node.lineno} asks a model's class")
        is_getattr = isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and len(node.args) > 1
        if is_getattr and getattr(node.args[1], "value", None) in ("family", "model_kind"):
            out.append(f"{rel}:{node.lineno} probes a model's family")
        if isinstance(node, ast.Attribute) and node.attr == "model_kind":
            out.append(f"{rel}:{node.lineno} reads a class's declaration (ask kind_of(model))")
        if isinstance(node, ast.Compare):
            consts = [c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
            family_attr = any(isinstance(n, ast.Attribute) and n.attr == "family" for n in ast.walk(node))
            if set(consts) & FAMILY_NAMES or (consts and family_attr):
                out.append(f"{rel}:{node.lineno} compares a family name")
    return out


def test_no_code_outside_the_models_asks_what_a_model_is():
    files = [p for p in SRC.rglob("*.py") if not p.relative_to(SRC).as_posix().startswith(OWN)]
    offences = [o for p in files for o in _offences(p)]
    assert not offences, "\n".join(offences)


@pytest.mark.parametrize(
    "code",
    [
        "isinstance(m, EnergyModel)",
        "isinstance(objective, dre.EnergyObjective)",
        "name in ('causal', 'hf_causal')",
        "getattr(model, 'family', None) or 'denoiser'",
        "kind_of(m).family == 'energy'",
        "type(m).model_kind.sampler",
    ],
)
def test_the_scan_finds_what_it_forbids(tmp_path, code):
    global SRC
    bad = tmp_path / "bad.py"
    bad.write_text(f"def f(m, name, objective):\n    return {code}\n")
    old, SRC = SRC, tmp_path
    try:
        assert len(_offences(bad)) == 1, code
    finally:
        SRC = old


# The answers the special cases gave before the models declared them, by `model.name` (what each place asked).
OLD_NOT_DENOISERS = {"energy", "causal", "mlm", "hollow", "hf_causal", "hf_mlm"}  # builders.source, tcsm lm-eval
OLD_FAMILY = {"energy": "energy", "mlm": "mlm", "hf_mlm": "mlm", "causal": "causal", "hf_causal": "causal",
              "hollow": "hollow"}  # builders.frozen / targets / objectives: EnergyModel, else `model.family`
OLD_EXPORT = {"energy": "energy", "hf_denoiser": "hf_denoiser", "diffusion_gemma": "diffusion_gemma",  # builders.export
              "hf_masked_dlm": "hf_masked_dlm"}  # fmt: skip


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_declarations_answer_what_the_special_cases_answered(name):
    kind = family_of_name(name)
    assert kind.is_denoiser == (name not in OLD_NOT_DENOISERS)
    assert kind.family == OLD_FAMILY.get(name, "denoiser")
    assert (kind.export or kind.family) == OLD_EXPORT.get(name, OLD_FAMILY.get(name, "denoiser"))
    # tcsm sample: SIR for an EnergyModel, refuse mlm | hollow | hf_mlm, left to right for causal | hf_causal;
    # lm-eval's causal reference and tcsm distill's teacher: causal | hf_causal
    assert (kind.sampler == "sir") == (name == "energy")
    assert (kind.sampler == "none") == (name in ("mlm", "hollow", "hf_mlm"))
    assert (kind.sampler == "left_to_right") == (name in ("causal", "hf_causal"))
    # tcsm eval: the costly estimate of an EnergyObjective (strategy ii: model.name=energy)
    assert (kind.likelihood == "estimate") == (name == "energy")
    # builders.source / lm-eval describe a model that is not a denoiser as before
    old_text = {"energy": "an energy model (tcsm finetune dre strategy ii; sampled by SIR)",
                "causal": "an autoregressive LM (a teacher for tcsm distill)",
                "mlm": "a masked LM (a teacher for target.name=parametric)",
                "hollow": "a Hollow LM (a teacher for target.name=parametric)",
                "hf_causal": "a Hugging Face causal LM", "hf_mlm": "a Hugging Face masked LM"}  # fmt: skip
    if name in old_text:
        assert kind.description == old_text[name]


def test_each_class_declares_the_kind_of_its_model_name():
    from tcsm.builders.hf_masked import HFMaskedDLM
    from tcsm.models.diffusion_gemma import DiffusionGemmaDenoiser
    from tcsm.models.hf import HFCausalLM, HFMaskedLM
    from tcsm.models.hf_denoiser import HFDenoiser

    classes = {"denoiser": Denoiser, "hf_denoiser": HFDenoiser, "mlm": MaskedLM, "causal": CausalLM,
               "hollow": HollowTransformer, "hf_mlm": HFMaskedLM, "hf_causal": HFCausalLM, "energy": EnergyModel,
               "diffusion_gemma": DiffusionGemmaDenoiser, "hf_masked_dlm": HFMaskedDLM}  # fmt: skip
    assert set(classes) == set(FAMILIES)
    for name, cls in classes.items():
        assert cls.model_kind is FAMILIES[name], name


def test_every_built_in_model_entry_declares_its_kind():
    from tcsm.builders.registry import MODELS

    assert set(FAMILIES) == {n for n in MODELS.names() if n != "grid_mlp"}  # the demo's MLP: a plain denoiser


def test_the_per_family_tables_of_the_upper_layers_cover_exactly_the_clean_families():
    """The teachers (targets) and default losses (objectives) are keyed by the families declared here."""
    from tcsm.models.lm_families import lm_families
    from tcsm.objectives.lm import LM_LOSSES
    from tcsm.targets.parametric import TEACHERS

    clean = {kind.family for kind in FAMILIES.values() if kind.likelihood == "nll"}
    assert set(TEACHERS) == set(LM_LOSSES) == set(lm_families()) == clean
