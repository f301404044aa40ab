"""What `tcsm export` writes for each model family: an `Exporter` registered under the family's declared
`ModelKind.export` (`EXPORTERS`) gives the export's config.json, writes its files, its model-card lines, the notes a
transformers user must know and the line that loads a LoRA adapter's base. `builders.export` only handles the
directory (built aside, swapped in atomically, its manifest). The built-in families: tcsm's denoiser, a denoiser
over a Hugging Face LM, the energy model, and the LMs of the data (loaded through tcsm only) here; DiffusionGemma and
the masked diffusion LMs with their own code in `builders.diffusion_gemma` and `builders.hf_masked`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, ClassVar

from safetensors.torch import save_file

from tcsm.builders.config import to_dict
from tcsm.builders.export_tokenizer import special_ids, write_tokenizer
from tcsm.builders.registry import FAMILY_MODULES
from tcsm.core.parts import Parts
from tcsm.models.kinds import kind_of
from tcsm.storage.checkpoint import EXPORT_FORMAT

__all__ = ["CODE_FILES", "EXPORTERS", "Exporter", "exporter_named", "exporter_of", "model_card"]

REMOTE_CODE = Path(__file__).resolve().parents[1] / "models" / "hf_remote"
CODE_FILES = ("configuration_tcsm.py", "modeling_tcsm.py")
BASE_MODEL = "base_model"

#: family (`ModelKind.export`) → its exporter; the families with their own builder module register there
EXPORTERS = Parts("exporter", homes=("tcsm.builders.exporters", *FAMILY_MODULES))


def exporter_of(model) -> Exporter:
    """The exporter of `model`'s declared family (`kind.export`); a model that declares none is exported for tcsm
    alone, under its family's name."""
    kind = kind_of(model)
    return exporter_named(kind.export or kind.family)


def exporter_named(kind: str | None) -> Exporter:
    """The exporter registered as `kind` (an export's config.json `kind`), else one for tcsm alone."""
    return EXPORTERS.get(kind)(kind) if kind is not None and kind in EXPORTERS else Exporter(kind)


class Exporter:
    """A model exported for tcsm alone (the LMs of the data): its weights under tcsm's names, the run's tokenizer,
    config.json with tcsm's keys and no modeling code for transformers. Subclasses add what their family carries."""

    name: ClassVar[str] = ""
    #: config.json names the tokenizer's end-of-text and padding ids (a family whose own config names them: False)
    names_special_ids: ClassVar[bool] = True

    def __init__(self, kind: str | None = None):
        self.kind = kind or self.name

    def native_keys(self, ck, model) -> dict[str, Any]:
        """tcsm's keys of config.json for a family whose config is the model's own Hugging Face config."""
        out = Exporter.config(self, ck, model)
        return {k: out[k] for k in ("kind", "source", "sampling", "tcsm")}

    def config(self, ck, model) -> dict[str, Any]:
        """config.json: the run's config, data and step under `tcsm`, the sampler defaults under `sampling`."""
        cfg = to_dict(ck.config)
        source = cfg["path"]["source"]
        V = int(ck.data_info["vocab_size"])
        return {
            "model_type": "tcsm",
            "kind": self.kind,
            "source": source,
            "vocab_size": V,
            "mask_id": V if source == "masked" else None,  # input id of [MASK] (not HF's mask_token_id: that must be < V)
            "torch_dtype": "float32",
            "tie_word_embeddings": False,
            "sampling": dict(cfg.get("sample") or {}),
            "tcsm": {"format": EXPORT_FORMAT, "step": int(ck.step), "weights": ck.weights, "config": cfg,
                     "data_info": dict(ck.data_info)},
        }  # fmt: skip

    def write_weights(self, tmp: Path, model, hf: dict) -> None:
        weights = {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})

    def write(self, tmp: Path, ck, model, hf: dict, run_dir: Path | None) -> list[str]:
        """Every file of the export but the sampler defaults, the card and the manifest; returns notes for the user."""
        self.write_weights(tmp, model, hf)
        notes = write_tokenizer(tmp, ck, run_dir, hf["source"] == "masked")
        if self.names_special_ids:
            hf.update(special_ids(tmp))  # generate() stops at the run's end of text
        (tmp / "config.json").write_text(json.dumps(hf, indent=1) + "\n", encoding="utf-8")
        if "auto_map" in hf:
            for name in CODE_FILES:
                shutil.copyfile(REMOTE_CODE / name, tmp / name)
        return notes

    def card_lines(self, hf: dict) -> list[str]:
        """How a transformers user loads it (README.md); nothing beyond tcsm.from_pretrained without modeling code."""
        if "auto_map" not in hf:
            return []
        return remote_code_lines(hf)

    def notes(self, hf: dict) -> list[str]:
        """What a transformers user of the export must know when it is written."""
        if "auto_map" in hf:
            return []
        return [(f"transformers cannot load this export: a {self.kind} model has no Hugging Face modeling code; load it "
                 "with tcsm.from_pretrained (or tcsm sample / tcsm eval / train.init_from)")]  # fmt: skip

    def loads_with(self, hf: dict) -> str:
        """What loads the export, for `tcsm export`'s one line."""
        return "tcsm.from_pretrained or transformers, trust_remote_code=True" if "auto_map" in hf else "tcsm.from_pretrained"

    def adapter_base_line(self, model) -> str:
        """The Python expression that loads a LoRA adapter's BASE for PEFT."""
        return "tcsm.from_pretrained(BASE).hf" if hasattr(model, "hf") else "tcsm.from_pretrained(BASE)"


def remote_code_lines(hf: dict, energy: bool = False) -> list[str]:
    """README lines for an export that carries tcsm's modeling code (`auto_map`, trust_remote_code): a denoiser's
    logits, or (`energy`) an energy model's f."""
    auto = "AutoModel" if energy else "AutoModelForMaskedLM"
    call = "model(input_ids=x_1, noisy_ids=x_t, timesteps=t).energy" if energy else "model(input_ids=x_t, timesteps=t).logits"
    if (hf.get("denoiser") or {}).get("block_length"):  # a block model reads the clean blocks before each block
        call = "model(input_ids=x_t, timesteps=t, clean_ids=x_1).logits"
    lines = [
        "```python",
        f"from transformers import {auto}, AutoTokenizer",
        f"model = {auto}.from_pretrained(DIR, trust_remote_code=True)",
        f"out = {call}   # t in [0, 1], t = 1 is clean; [MASK] = V",
        "tokenizer = AutoTokenizer.from_pretrained(DIR, trust_remote_code=True)  # mask_token_id = V",
        "ids = tokenizer(text, add_special_tokens=False).input_ids   # as the run's data was encoded",
        "```",
        "",
        "`trust_remote_code=True` for the tokenizer too: transformers reads config.json (which names the modeling",
        "code) before the tokenizer, and asks interactively otherwise.",
    ]
    if not energy and hf["source"] == "masked":
        lines += [
            "",
            "`model.generate(input_ids=prompt, max_new_tokens=N)` (or `num_samples=`) samples with the run's sampler",
            "defaults (`config.sampling`) and pads after the first end-of-text token.",
        ]
    return lines


def _auto_map(config: str, model: str, masked_lm: bool) -> dict:
    out = {"AutoConfig": f"configuration_tcsm.{config}", "AutoModel": f"modeling_tcsm.{model}"}
    return {**out, "AutoModelForMaskedLM": f"modeling_tcsm.{model}"} if masked_lm else out


@EXPORTERS.register
class DenoiserExporter(Exporter):
    """tcsm's denoiser, with its modeling code (AutoModelForMaskedLM)."""

    name = "denoiser"
    architecture: ClassVar[tuple[str, str]] = ("TCSMConfig", "TCSMForMaskedLM")

    def config(self, ck, model) -> dict[str, Any]:
        out = super().config(ck, model)
        out["denoiser"] = model.cfg.to_dict()
        out["architectures"] = [self.architecture[1]]
        out["auto_map"] = _auto_map(*self.architecture, masked_lm=True)
        return out


@EXPORTERS.register
class HFDenoiserExporter(DenoiserExporter):
    """A denoiser started from a Hugging Face LM: its base architecture travels in base_model/."""

    name = "hf_denoiser"
    architecture = ("TCSMHFDenoiserConfig", "TCSMHFDenoiserForMaskedLM")

    def config(self, ck, model) -> dict[str, Any]:
        out = super().config(ck, model)
        # Where the pretrained architecture travels: base_model/config.json, named relative to the export.
        out["tcsm"]["config"]["model"]["name_or_path"] = BASE_MODEL
        out["base_model"] = model.hf.config.to_dict()
        return {**{k: out[k] for k in out if k not in ("architectures", "auto_map")},
                "architectures": out["architectures"], "auto_map": out["auto_map"]}  # fmt: skip

    def write(self, tmp, ck, model, hf, run_dir) -> list[str]:
        notes = super().write(tmp, ck, model, hf, run_dir)
        model.hf.config.save_pretrained(tmp / BASE_MODEL)
        return notes

    def notes(self, hf: dict) -> list[str]:
        """An adapted model's base architecture must be one this transformers can build."""
        from tcsm.models.hf_denoiser import auto_class_kind

        try:
            from transformers.models.auto import modeling_auto
            from transformers.models.auto.configuration_auto import CONFIG_MAPPING
        except ImportError:
            return ["transformers is not installed here, so the export was not checked against it"]
        base_type = hf["base_model"].get("model_type")
        lm = auto_class_kind(hf["denoiser"])
        names = getattr(modeling_auto, f"MODEL_FOR_{lm}_MAPPING_NAMES", {})
        if base_type not in CONFIG_MAPPING or base_type not in names:
            return [(f"transformers cannot load this export: its base model type {base_type!r} is not a "
                     f"{lm.lower().replace('_', ' ')} class of transformers here (remote code of its own is not carried); "
                     "load it with tcsm.from_pretrained")]  # fmt: skip
        return []


@EXPORTERS.register
class EnergyExporter(Exporter):
    """The strategy-(ii) energy model: its reference denoiser and ratio head, with modeling code (AutoModel)."""

    name = "energy"

    def config(self, ck, model) -> dict[str, Any]:
        out = super().config(ck, model)
        out["denoiser"] = model.reference.cfg.to_dict()
        out["ratio_head"] = model.head.cfg.to_dict()
        out["architectures"] = ["TCSMEnergyModel"]
        out["auto_map"] = _auto_map("TCSMEnergyConfig", "TCSMEnergyModel", masked_lm=False)
        return out

    def card_lines(self, hf: dict) -> list[str]:
        return remote_code_lines(hf, energy=True)


def model_card(ck, hf: dict, summary: dict | None, n_params: int, source_dir: Path, use: list[str]) -> str:
    """README.md of an export: the run's measured figures (summary.json) and `use`, the family's loading lines."""
    cfg = hf["tcsm"]["config"]
    info = ck.data_info
    lines = [
        "---",
        "library_name: tcsm",
        "tags: [discrete-diffusion, tcsm]",
        "---",
        "",
        f"# tcsm {hf['kind']} ({hf['source']} source)",
        "",
        (
            f"A {hf['kind']} trained with tcsm (Target Concrete Score Matching), exported from "
            f"`{source_dir}` at step {ck.step} ({ck.weights} weights), {n_params / 1e6:.2f}M parameters."
        ),
        "",
        "| | |",
        "|---|---|",
        f"| data | {info.get('label') or info.get('name')} (V = {info['vocab_size']} tokens, length {info['seq_len']}) |",
        f"| path | {cfg['path']['source']}, {cfg['path']['schedule']} schedule |",
        f"| objective | {json.dumps(cfg.get('objective'))} |",
        f"| steps | {cfg['train']['steps']} × batch {cfg['train']['batch_size']} |",
    ]
    if summary:
        bound = summary.get("bound", "?")
        if "bpc" in summary:
            lines.append(
                f"| validation ({bound}) | {summary['bpc']:.4f} ± {summary.get('bpc_stderr', float('nan')):.4f} bits "
                f"per token over {summary.get('num_sequences', '?')} sequences |"
            )
        if summary.get("perplexity") is not None:
            lines.append(
                f"| perplexity | {summary['perplexity']:.4f} ± {summary.get('perplexity_stderr', float('nan')):.4f} |"
            )
        test = summary.get("test")
        if isinstance(test, dict) and "bpc" in test:
            lines.append(f"| test ({test.get('bound', bound)}) | {test['bpc']:.4f} ± {test.get('bpc_stderr', 0):.4f} bits per token |")
        if "elapsed_s" in summary:
            lines.append(f"| training time | {summary['elapsed_s']:.0f} s |")
    else:
        lines.append("| figures | none measured (the run has no summary.json) |")
    lines += [
        "",
        "Figures are the run's own (`summary.json`); a bound is an upper bound on the NLL, labelled by its type.",
        "",
        "## Use",
        "",
        "```python",
        "import tcsm",
        "model = tcsm.from_pretrained(DIR)            # no transformers needed",
        "```",
    ]
    lines += use
    lines += [
        "",
        "`tcsm sample DIR`, `tcsm eval DIR` and `train.init_from=DIR` take the directory as they take a run.",
        "Sampler defaults: `sampling_config.json`. The run's full config: `config.json` → `tcsm.config`.",
        "",
    ]
    return "\n".join(lines)


