"""Models declare what they are (DESIGN.md "capabilities are declared, not probed"): every model class carries a
`kind` (family, sampler, export), `FAMILIES` is the one table of config model names, and no code outside the models'
own packages asks a model's class or compares a family name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from train_helpers import restore_torch_threads  # noqa: F401

from tcsm.models import Denoiser, DenoiserConfig
from tcsm.models.clean_families import build_clean_model
from tcsm.models.kinds import DENOISER, FAMILIES, ModelKind, family_of_name, kind_of
from tcsm.posttrain.dre.energy import EnergyModel

SRC = Path(__file__).resolve().parents[2] / "src" / "tcsm"
#: where a model's own class and family names may be named: the models and their builder (an HF denoiser's
#: `kind: mlm | causal` is its config's), the energy model's method folder, the readers of old configs
OWN = ("models/", "builders/models.py", "posttrain/dre/", "storage/migration.py")
#: family names that are only family names ("energy" and "hf_denoiser" are also `tcsm export`'s kinds, which the
#: exporter dispatches on by design)
FAMILY_NAMES = {"mlm", "causal", "hollow", "hf_mlm", "hf_causal"}


def test_every_family_declares_every_field():
    for name, kind in FAMILIES.items():
        assert isinstance(kind, ModelKind) and kind.family and kind.description, name
        assert kind.sampler in ("path", "left_to_right", "sir", "none"), name
        assert kind.export in (None, "denoiser", "hf_denoiser", "energy"), name
        assert kind.is_denoiser == (kind.sampler == "path"), name
    assert family_of_name(None) is DENOISER and family_of_name("a.plugin:model") is DENOISER


def test_each_model_class_answers_what_the_special_cases_answered():
    denoiser = Denoiser(DenoiserConfig(vocab_size=5, num_states=6, max_len=4, d_model=16, n_layers=1, n_heads=2))
    assert kind_of(denoiser) is DENOISER and kind_of(denoiser).export == "denoiser"
    for family, sampler in (("mlm", "none"), ("causal", "left_to_right"), ("hollow", "none")):
        model = build_clean_model(family, "tiny", vocab_size=5, max_len=4)
        assert (kind_of(model).family, kind_of(model).sampler, kind_of(model).export) == (family, sampler, None)
    energy = EnergyModel.kind  # the class declares it; building one needs a trained reference
    assert (energy.family, energy.sampler, energy.export) == ("energy", "sir", "energy")
    # wrappers (torch.compile, DDP) answer for the model inside; a bare callable is a denoiser
    assert kind_of(torch.nn.Module()) is DENOISER and kind_of(lambda x, t: x) is DENOISER
    wrapped = torch.nn.Module()
    wrapped._orig_mod = build_clean_model("causal", "tiny", vocab_size=5, max_len=4)
    assert kind_of(wrapped).family == "causal"


def _offences(path: Path) -> list[str]:
    rel = path.relative_to(SRC).as_posix()
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            names = {getattr(n, "id", getattr(n, "attr", None)) for n in ast.walk(node.args[1])}
            if names & {"EnergyModel", "HFDenoiser", "Denoiser", "MaskedLM", "CausalLM", "HollowTransformer"}:
                out.append(f"{rel}:{node.lineno} asks a model's class")
        if isinstance(node, ast.Compare):
            consts = [c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
            if set(consts) & FAMILY_NAMES:
                out.append(f"{rel}:{node.lineno} compares a family name")
    return out


def test_no_code_outside_the_models_asks_what_a_model_is():
    files = [p for p in SRC.rglob("*.py") if not p.relative_to(SRC).as_posix().startswith(OWN)]
    offences = [o for p in files for o in _offences(p)]
    assert not offences, "\n".join(offences)


def test_the_scan_finds_what_it_forbids(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(m, name):\n    return isinstance(m, EnergyModel) or name in ('causal', 'hf_causal')\n")
    global SRC
    old, SRC = SRC, tmp_path
    try:
        assert len(_offences(bad)) == 2
    finally:
        SRC = old


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_families_table_matches_the_registered_models(name):
    from tcsm.builders.registry import MODELS

    assert name in MODELS
