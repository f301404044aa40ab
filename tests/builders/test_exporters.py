"""builders/exporters.py: the exporter registry answers by a model's declared `ModelKind.export`, every exportable
family has its exporter, and each exporter writes its family's files and config.json keys (on a tiny run): tcsm's
denoiser with its modeling code, a model exported for tcsm alone without it, the energy model's card lines."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import restore_torch_threads, tiny  # noqa: F401

from tcsm.builders.config import load_config
from tcsm.builders.exporters import (
    CODE_FILES,
    EXPORTERS,
    DenoiserExporter,
    EnergyExporter,
    Exporter,
    HFDenoiserExporter,
    exporter_named,
    exporter_of,
    model_card,
    remote_code_lines,
)
from tcsm.builders.loading import load_checkpoint
from tcsm.builders.registry import model_families
from tcsm.cli.train import train
from tcsm.models.kinds import ModelKind

FAMILIES = model_families()


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    """A 2-step masked synthetic run, loaded."""
    root = tmp_path_factory.mktemp("exporters")
    with torch.random.fork_rng(devices=[]):
        cfg = load_config("synthetic", tiny("train.steps=2", "train.eval_every=0", "sample.num=0"))
        train(cfg, root / "run", log=lambda s: None)
    return load_checkpoint(root / "run")


def test_every_exportable_family_has_its_exporter_and_nothing_else_is_registered():
    declared = {kind.export for kind in FAMILIES.values() if kind.export is not None}
    assert declared == set(EXPORTERS.names())
    assert all(EXPORTERS.get(name).name == name for name in declared)


def test_an_unknown_or_duplicate_exporter_is_one_line():
    with pytest.raises(ValueError, match=r"^unknown exporter 'nope'; choose one of \[") as e:
        EXPORTERS.get("nope")
    assert "denoiser" in str(e.value) and "\n" not in str(e.value)

    class Again(Exporter):
        name = "denoiser"

    with pytest.raises(ValueError, match="exporter name 'denoiser' is empty or already registered"):
        EXPORTERS.register(Again)
    assert EXPORTERS.get("denoiser") is DenoiserExporter


def _declaring(kind: ModelKind):
    return type("Toy", (torch.nn.Module,), {"model_kind": kind})()


@pytest.mark.parametrize("name, cls", [("denoiser", DenoiserExporter), ("hf_denoiser", HFDenoiserExporter),
                                       ("energy", EnergyExporter), ("causal", Exporter), ("mlm", Exporter)])
def test_the_exporter_is_the_declared_familys(name, cls):
    exporter = exporter_of(_declaring(FAMILIES[name]))
    assert type(exporter) is cls
    assert exporter.kind == (FAMILIES[name].export or FAMILIES[name].family)  # an LM is exported under its family


def test_a_plain_callable_is_exported_as_a_denoiser():
    assert type(exporter_of(lambda x, t: x)) is DenoiserExporter


def test_the_denoiser_writes_its_weights_config_and_modeling_code(ck, tmp_path):
    exporter = exporter_of(ck.model)
    hf = exporter.config(ck, ck.model)
    V = int(ck.data_info["vocab_size"])
    assert hf["kind"] == "denoiser" and hf["source"] == "masked" and hf["vocab_size"] == V and hf["mask_id"] == V
    assert hf["denoiser"] == ck.model.cfg.to_dict() and hf["architectures"] == ["TCSMForMaskedLM"]
    assert hf["auto_map"]["AutoModelForMaskedLM"] == "modeling_tcsm.TCSMForMaskedLM"
    assert hf["tcsm"]["step"] == ck.step == 2 and hf["tcsm"]["config"]["path"]["source"] == "masked"
    notes = exporter.write(tmp_path, ck, ck.model, hf, ck.directory)
    files = {p.name for p in tmp_path.iterdir()}
    assert {"model.safetensors", "config.json", *CODE_FILES} <= files
    assert notes == []
    chars = ck.data_info["chars"]  # the synthetic data's character vocabulary: one token each, [MASK] = V
    tokenizer = json.loads((tmp_path / "tokenizer.json").read_text())
    assert tokenizer["model"]["vocab"] == {c: i for i, c in enumerate(chars)} and len(chars) == V
    assert [(t["id"], t["content"]) for t in tokenizer["added_tokens"]] == [(V, "[MASK]")]
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["mask_token"] == "[MASK]"
    written = load_file(str(tmp_path / "model.safetensors"))
    assert written.keys() == ck.model.state_dict().keys()
    assert all(torch.equal(written[k], v) for k, v in ck.model.state_dict().items())
    assert json.loads((tmp_path / "config.json").read_text()) == json.loads(json.dumps(hf))
    assert exporter.notes(hf) == [] and "AutoModelForMaskedLM" in "\n".join(exporter.card_lines(hf))


def test_a_family_for_tcsm_alone_has_no_modeling_code_and_says_so(ck, tmp_path):
    exporter = Exporter("causal")
    hf = exporter.config(ck, ck.model)
    assert hf["kind"] == "causal" and "auto_map" not in hf and "architectures" not in hf
    exporter.write(tmp_path, ck, ck.model, hf, None)
    assert not any((tmp_path / name).exists() for name in CODE_FILES)
    assert exporter.card_lines(hf) == []
    (note,) = exporter.notes(hf)
    assert note.startswith("transformers cannot load this export: a causal model") and "tcsm.from_pretrained" in note


def test_native_keys_are_tcsms_own(ck):
    keys = Exporter("x").native_keys(ck, ck.model)
    assert set(keys) == {"kind", "source", "sampling", "tcsm"} and keys["kind"] == "x"


def test_the_energy_card_calls_f_and_a_block_model_reads_its_clean_blocks():
    energy = EnergyExporter().card_lines({"source": "masked"})
    assert any("AutoModel.from_pretrained" in line for line in energy)
    assert any(".energy" in line for line in energy) and not any("generate" in line for line in energy)
    block = remote_code_lines({"source": "uniform", "denoiser": {"block_length": 4}})
    assert any("clean_ids=x_1" in line for line in block) and not any("generate" in line for line in block)
    masked = remote_code_lines({"source": "masked", "denoiser": {}})
    assert any("generate" in line for line in masked) and not any("clean_ids" in line for line in masked)


def test_lora_loads_its_base_through_the_exporter():
    plain = torch.nn.Linear(2, 2)
    wrapped = torch.nn.Module()
    wrapped.hf = plain
    assert Exporter().adapter_base_line(plain) == "tcsm.from_pretrained(BASE)"
    assert Exporter().adapter_base_line(wrapped) == "tcsm.from_pretrained(BASE).hf"


def test_the_model_card_reports_the_runs_figures_or_that_there_are_none(ck, tmp_path):
    hf = Exporter("denoiser").config(ck, ck.model)
    none = model_card(ck, hf, None, 1234, tmp_path, ["USE-LINE"])
    assert "| figures | none measured (the run has no summary.json) |" in none and "USE-LINE" in none
    assert "0.00M parameters" in none and f"step {ck.step}" in none
    summary = {"bound": "nelbo", "bpc": 1.23456, "bpc_stderr": 0.01, "num_sequences": 8, "elapsed_s": 3.4}
    card = model_card(ck, hf, summary, 2_500_000, tmp_path, [])
    assert "| validation (nelbo) | 1.2346 ± 0.0100 bits per token over 8 sequences |" in card
    assert "| training time | 3 s |" in card and "2.50M parameters" in card and "none measured" not in card


def test_the_family_says_what_loads_its_export():
    """`tcsm export`'s last line comes from the exporter of the export's config.json `kind`, never a family test."""
    assert exporter_named("denoiser").loads_with({"auto_map": {}}).endswith("transformers, trust_remote_code=True")
    assert exporter_named("causal").loads_with({}) == "tcsm.from_pretrained"  # transformers has no code for it
    assert type(exporter_named(None)) is Exporter and type(exporter_named("nope")) is Exporter
    gemma = exporter_named("diffusion_gemma")
    assert gemma.kind == "diffusion_gemma" and "DiffusionGemmaForBlockDiffusion" in gemma.loads_with({})
    assert "trust_remote_code=True" in exporter_named("hf_masked_dlm").loads_with({})


def test_the_export_command_prints_its_familys_line(ck, tmp_path, capsys):
    from tcsm.cli import main

    assert main(["export", str(ck.directory), "-o", str(tmp_path / "hf")]) == 0
    out = capsys.readouterr().out
    assert "(load with tcsm.from_pretrained or transformers, trust_remote_code=True)" in out
