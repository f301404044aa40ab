"""Models that leave tcsm: `export(run, out_dir)` writes a trained run as a Hugging Face-style directory, and
`from_pretrained(out_dir)` reads it back (no `transformers` needed).

The directory (`tcsm.storage.checkpoint.EXPORT_FORMAT`):

    config.json              model_type "tcsm", auto_map for trust_remote_code, the architecture, the sampler
                             defaults (`sampling`) and, under `tcsm`, the run's config, data and step
    model.safetensors        the run's weights (EMA ones when it kept them), tcsm's parameter names
    modeling_tcsm.py         self-contained modeling code (torch + transformers, no tcsm import), with
    configuration_tcsm.py    AutoModelForMaskedLM (denoisers) and AutoModel (energy models) in `auto_map`
    tokenizer.json           the run's tokenizer (its BPE file, or the character vocabulary as a tokenizers file)
    sampling_config.json     the run's `sample:` settings (what `tcsm sample DIR` uses by default)
    README.md                a model card with the run's measured figures (summary.json)
    manifest.json            sha256 of config.json and model.safetensors; written last

Everything that reads checkpoints (`load_checkpoint`, `train.init_from`, frozen references, `tcsm sample`,
`tcsm eval`) reads an export directory too, through `tcsm.storage.checkpoint`. It is built in a hidden temporary
directory and renamed into place; an existing directory is replaced only if it holds an export, and then only
the files that export wrote (the manifest's `written`).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from tcsm.builders.config import to_dict
from tcsm.builders.loading import load_checkpoint
from tcsm.builders.lora import lora_choice, write_adapter
from tcsm.core.errors import CheckpointError, ConfigError
from tcsm.models.hf_denoiser import auto_class_kind
from tcsm.models.kinds import kind_of
from tcsm.models.lora import merge as merge_adapters
from tcsm.storage.checkpoint import EXPORT_FORMAT, MANIFEST, is_export_dir
from tcsm.storage.fileio import file_digest, fsync_dir, fsync_file

__all__ = ["char_tokenizer_json", "export", "from_pretrained"]

_REMOTE_CODE = Path(__file__).resolve().parents[1] / "models" / "hf_remote"
_CODE_FILES = ("configuration_tcsm.py", "modeling_tcsm.py")
BASE_MODEL = "base_model"


def from_pretrained(directory: str | os.PathLike, device: str | torch.device = "cpu") -> torch.nn.Module:
    """The model of an export directory (or of any run / checkpoint directory), in eval mode."""
    return load_checkpoint(directory, device=device).model


def _kind(model) -> str:
    """What the export writes for `model` (its declared `kind.export`; its family when it cannot be exported)."""
    kind = kind_of(model)
    return kind.export or kind.family


def char_tokenizer_json(chars: str, mask: bool) -> dict:
    """A Hugging Face `tokenizers` file for a character vocabulary: each character is one token (a BPE model
    with no merges over the whole text), ids in the order of `chars`; [MASK] = V added when `mask`."""
    vocab = {c: i for i, c in enumerate(chars)}
    added = (
        [{"id": len(chars), "content": "[MASK]", "single_word": False, "lstrip": False, "rstrip": False,
          "normalized": False, "special": True}]
        if mask
        else []
    )  # fmt: skip
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": None, "post_processor": None, "decoder": {"type": "Fuse"},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }  # fmt: skip


def _run_dir(directory: Path) -> Path | None:
    return directory.parent.parent if directory.parent.name == "checkpoints" else None


def _hf_config(ck, model, kind: str) -> dict[str, Any]:
    cfg = to_dict(ck.config)
    source = cfg["path"]["source"]
    V = int(ck.data_info["vocab_size"])
    out: dict[str, Any] = {
        "model_type": "tcsm",
        "kind": kind,
        "source": source,
        "vocab_size": V,
        "mask_id": V if source == "masked" else None,  # input id of [MASK] (not HF's mask_token_id: that must be < V)
        "torch_dtype": "float32",
        "tie_word_embeddings": False,
        "sampling": dict(cfg.get("sample") or {}),
        "tcsm": {
            "format": EXPORT_FORMAT,
            "step": int(ck.step),
            "weights": ck.weights,
            "config": cfg,
            "data_info": dict(ck.data_info),
        },
    }
    if kind == "hf_denoiser":
        # Where the pretrained architecture travels: base_model/config.json, named relative to the export.
        cfg["model"]["name_or_path"] = BASE_MODEL
        out["denoiser"] = model.cfg.to_dict()
        out["base_model"] = model.hf.config.to_dict()
        out["architectures"] = ["TCSMHFDenoiserForMaskedLM"]
        out["auto_map"] = {
            "AutoConfig": "configuration_tcsm.TCSMHFDenoiserConfig",
            "AutoModel": "modeling_tcsm.TCSMHFDenoiserForMaskedLM",
            "AutoModelForMaskedLM": "modeling_tcsm.TCSMHFDenoiserForMaskedLM",
        }
    elif kind == "denoiser":
        out["denoiser"] = model.cfg.to_dict()
        out["architectures"] = ["TCSMForMaskedLM"]
        out["auto_map"] = {
            "AutoConfig": "configuration_tcsm.TCSMConfig",
            "AutoModel": "modeling_tcsm.TCSMForMaskedLM",
            "AutoModelForMaskedLM": "modeling_tcsm.TCSMForMaskedLM",
        }
    elif kind == "energy":
        out["denoiser"] = model.reference.cfg.to_dict()
        out["ratio_head"] = model.head.cfg.to_dict()
        out["architectures"] = ["TCSMEnergyModel"]
        out["auto_map"] = {
            "AutoConfig": "configuration_tcsm.TCSMEnergyConfig",
            "AutoModel": "modeling_tcsm.TCSMEnergyModel",
        }
    elif kind == "diffusion_gemma":
        from tcsm.builders.diffusion_gemma import native_config

        return native_config(model, {k: out[k] for k in ("kind", "source", "sampling", "tcsm")})
    elif kind == "hf_masked_dlm":  # the model's own directory, loaded by its own modeling code
        from tcsm.builders.hf_masked import native_config

        return native_config(model, {k: out[k] for k in ("kind", "source", "sampling", "tcsm")})
    # LMs (mlm / causal / hollow teachers) and Hugging Face-backed models load through tcsm only.
    return out


def _card(ck, hf: dict, summary: dict | None, n_params: int, source_dir: Path) -> str:
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
    if hf["kind"] == "diffusion_gemma":
        lines += [
            "```python",
            "from transformers import DiffusionGemmaForBlockDiffusion   # no trust_remote_code: the model's own files",
            "model = DiffusionGemmaForBlockDiffusion.from_pretrained(DIR)",
            "out = model.generate(prompt_ids, max_new_tokens=N)",
            "```",
        ]
    if hf["kind"] == "hf_masked_dlm":
        lines += [
            "```python",
            "from transformers import AutoModel   # the model's own modeling code, as the directory it came from",
            "model = AutoModel.from_pretrained(DIR, trust_remote_code=True)",
            "logits = model(input_ids=x).logits   # x holds mask_token_id at masked positions",
            "```",
        ]
    elif "auto_map" in hf:
        auto = "AutoModel" if hf["kind"] == "energy" else "AutoModelForMaskedLM"
        call = "model(input_ids=x_t, timesteps=t).logits" if hf["kind"] != "energy" else (
            "model(input_ids=x_1, noisy_ids=x_t, timesteps=t).energy"
        )
        if (hf.get("denoiser") or {}).get("block_length"):  # a block model reads the clean blocks before each block
            call = "model(input_ids=x_t, timesteps=t, clean_ids=x_1).logits"
        lines += [
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
        if hf["kind"] != "energy" and hf["source"] == "masked":
            lines += [
                "",
                "`model.generate(input_ids=prompt, max_new_tokens=N)` (or `num_samples=`) samples with the run's sampler",
                "defaults (`config.sampling`) and pads after the first end-of-text token.",
            ]
    lines += [
        "",
        "`tcsm sample DIR`, `tcsm eval DIR` and `train.init_from=DIR` take the directory as they take a run.",
        "Sampler defaults: `sampling_config.json`. The run's full config: `config.json` → `tcsm.config`.",
        "",
    ]
    return "\n".join(lines)


#: what exports wrote before their manifest listed every file (`written`): an older export's own files
_OLD_EXPORT_FILES = (
    "config.json", "model.safetensors", MANIFEST, *_CODE_FILES, "tokenizer.json", "tokenizer_config.json",
    "sampling_config.json", "README.md", BASE_MODEL,
)  # fmt: skip


def _export_files(out: Path) -> set[str]:
    """The top-level names the export in `out` wrote (its manifest's `written`, else the older exports' set)."""
    try:
        written = json.loads((out / MANIFEST).read_text(encoding="utf-8")).get("written")
    except (OSError, ValueError, AttributeError):
        written = None
    if not isinstance(written, list):
        written = _OLD_EXPORT_FILES
    return {str(name).split("/")[0] for name in written} | {MANIFEST}


def _listing(names) -> str:
    names = sorted(names)
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _prepare_target(out: Path, overwrite: bool, keep_others: bool = False) -> list[str]:
    """Refuse a target that is not new, empty or an earlier export to replace; returns the entries of `out` that
    its earlier export did not write (kept in place: only with `keep_others`)."""
    if not out.exists():
        return []
    if not out.is_dir():
        raise CheckpointError(f"export target {str(out)!r} is a file; choose a directory")
    entries = {p.name for p in out.iterdir()}
    if entries and not is_export_dir(out):
        from tcsm.storage.checkpoint import list_checkpoints

        run = (out / "checkpoints").is_dir() or (out / "config.yaml").is_file() or list_checkpoints(out)
        what = "holds a training run" if run else "exists and does not hold a tcsm export"
        raise CheckpointError(f"export target {str(out)!r} {what}; choose a new or empty directory")
    if entries and not overwrite:
        raise CheckpointError(f"export target {str(out)!r} already holds an export; pass --overwrite to replace it")
    others = sorted(entries - _export_files(out))
    if others and not keep_others:
        raise CheckpointError(
            f"export target {str(out)!r} holds files the earlier export did not write ({_listing(others)}); "
            "--overwrite replaces only an export's own files: move those away, or add --keep-other-files to "
            "replace the export and leave them in place"
        )
    return others


def _write_failure(out: Path, e: BaseException) -> str:
    text = " ".join(str(e).split())
    full = getattr(e, "errno", None) == errno.ENOSPC or "No space left" in text or "StorageFull" in text
    cause = "the disk is full (no space left on device)" if full else f"{type(e).__name__}: {text}"
    kept = "the earlier export there is unchanged" if is_export_dir(out) else "nothing was written"
    return f"cannot write the export to {str(out)!r}: {cause}; {kept}" + ("; free space and export again" if full else "")


def _swap_in(tmp: Path, out: Path, others: list[str]) -> None:
    """Replace the export in `out` by the one built in `tmp`. Without other files the directories are swapped
    whole; with them (--keep-other-files), the old export's entries move out and the new ones in, manifest last."""
    if not out.exists():
        os.replace(tmp, out)
        return
    trash = out.parent / f".old-export-{out.name}-{uuid.uuid4().hex[:8]}"
    if not others:
        os.replace(out, trash)
        os.replace(tmp, out)
        shutil.rmtree(trash, ignore_errors=True)
        return
    trash.mkdir()
    old = sorted({p.name for p in out.iterdir()} - set(others), key=lambda n: n != MANIFEST)  # manifest first
    new = sorted((p.name for p in tmp.iterdir()), key=lambda n: n == MANIFEST)  # manifest last
    moved_out, moved_in = [], []
    try:
        for name in old:
            os.replace(out / name, trash / name)
            moved_out.append(name)
        for name in new:
            os.replace(tmp / name, out / name)
            moved_in.append(name)
    except BaseException:  # put the old export back as it was
        for name in reversed(moved_in):
            os.replace(out / name, tmp / name)
        for name in reversed(moved_out):
            os.replace(trash / name, out / name)
        shutil.rmtree(trash, ignore_errors=True)
        raise
    shutil.rmtree(trash, ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)


def export(
    run: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    ema: bool = True,
    overwrite: bool = False,
    keep_other_files: bool = False,
    log: Callable[[str], None] | None = None,
    lora_merge: bool | None = None,
) -> Path:
    """Write the model of `run` (a run, checkpoints, step or export directory) to `out_dir` (see the module
    docstring); returns `out_dir`. Refuses a non-empty `out_dir` that is not an export, and an existing export
    unless `overwrite`; an overwrite replaces only the files the earlier export wrote (its manifest's `written`),
    and refuses a directory holding others unless `keep_other_files`, which leaves them in place. What a user must
    know about the result (e.g. that transformers cannot load it) goes to `log`, one line each (default: stderr).
    A LoRA run: `lora_merge` (else its `train.lora.merge`) True writes the weights with the adapters folded in (a
    plain export), False a PEFT adapter directory (into a new or empty `out_dir`)."""
    out = Path(out_dir)
    ck = load_checkpoint(run, device="cpu", ema=ema)
    merge = lora_choice(ck.config, ck.model, lora_merge)
    if merge is False:
        return _export_adapter(ck, out, log, overwrite)
    if merge:
        try:
            merge_adapters(ck.model)
        except ValueError as e:
            raise ConfigError(f"cannot export {str(run)!r} merged: {e}") from None
    others = _prepare_target(out, overwrite, keep_other_files)
    model, kind = ck.model, _kind(ck.model)
    hf = _hf_config(ck, model, kind)
    if merge:  # the export is a plain model: tcsm reads it back without adapters
        hf["tcsm"]["config"]["train"]["lora"].update(r=0, target_modules=None)
    run_dir = _run_dir(ck.directory)
    summary = None
    for where in (run_dir, ck.directory):
        if where is not None and (where / "summary.json").is_file():
            summary = json.loads((where / "summary.json").read_text(encoding="utf-8"))
            break
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-export-{out.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        if kind == "hf_masked_dlm":  # its modeling code, tokenizer and special ids are the directory's own
            from tcsm.builders.hf_masked import write_native as write_own

            notes = write_own(tmp, model, hf, ck.config.model.get("name_or_path"))
        else:
            if kind == "diffusion_gemma":  # the model's own directory: transformers loads it as it is
                from tcsm.builders.diffusion_gemma import write_native

                write_native(tmp, model, hf)
            else:
                weights = {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
                save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
            notes = _write_tokenizer(tmp, ck, run_dir, hf["source"] == "masked")
            if kind != "diffusion_gemma":  # its own config names its special tokens
                hf.update(_special_ids(tmp))  # generate() stops at the run's end of text
            (tmp / "config.json").write_text(json.dumps(hf, indent=1) + "\n", encoding="utf-8")
        (tmp / "sampling_config.json").write_text(json.dumps(hf["sampling"], indent=1) + "\n", encoding="utf-8")
        if kind == "hf_denoiser":
            model.hf.config.save_pretrained(tmp / BASE_MODEL)
        if "auto_map" in hf and kind != "hf_masked_dlm":  # that one carries its own code
            for name in _CODE_FILES:
                shutil.copyfile(_REMOTE_CODE / name, tmp / name)
        notes += _transformers_notes(hf, kind)
        n_params = sum(p.numel() for p in model.parameters())
        (tmp / "README.md").write_text(_card(ck, hf, summary, n_params, ck.directory), encoding="utf-8")
        files = {}
        for name in ("config.json", "model.safetensors"):
            fsync_file(tmp / name)
            files[name] = {"sha256": file_digest(tmp / name), "bytes": (tmp / name).stat().st_size}
        # `written`: every file of the export, so that a later --overwrite replaces these and nothing else.
        written = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file()) + [MANIFEST]
        manifest = {"format": EXPORT_FORMAT, "step": int(ck.step), "files": files, "written": written}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        fsync_file(tmp / MANIFEST)
        fsync_dir(tmp)
        _swap_in(tmp, out, others)
        fsync_dir(out.parent)
    except (OSError, SafetensorError) as e:  # e.g. a full disk: one line, the earlier export untouched
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(_write_failure(out, e)) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _say_notes(notes, log)
    return out


def _say_notes(notes: list[str], log) -> None:
    """The export's notes, one line each, to `log` (default: stderr)."""
    say = log if log is not None else (lambda line: print(line, file=sys.stderr))
    for note in notes:
        say(f"tcsm export: note: {note}")


#: what `write_adapter` writes: a directory of these alone is an earlier adapter export that --overwrite replaces
_ADAPTER_FILES = {"adapter_config.json", "adapter_model.safetensors", "README.md"}


def _export_adapter(ck, out: Path, log, overwrite: bool = False) -> Path:
    """A LoRA run's adapters as PEFT's adapter directory, written whole or not at all into a new or empty `out`, or
    over an earlier adapter export with `overwrite`."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        entries = {p.name for p in out.iterdir()} if out.is_dir() else set()
        if not ("adapter_config.json" in entries and entries <= _ADAPTER_FILES):
            raise CheckpointError(f"a LoRA adapter is exported into a new or empty directory, or over an earlier "
                                  f"adapter export; {str(out)!r} is neither")  # fmt: skip
        if not overwrite:
            raise CheckpointError(f"export target {str(out)!r} already holds a LoRA adapter export; pass --overwrite "
                                  "to replace it")  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-export-{out.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        notes = write_adapter(tmp, ck.model, ck.config)
        fsync_dir(tmp)
        if out.exists():
            trash = out.parent / f".old-export-{out.name}-{uuid.uuid4().hex[:8]}"
            os.replace(out, trash)
            os.replace(tmp, out)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(_write_failure(out, e)) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _say_notes(notes, log)
    return out


def _transformers_notes(hf: dict, kind: str) -> list[str]:
    """What a transformers user of the export must know when it is written: a kind with no modeling code loads
    through tcsm only, and an adapted model's base architecture must be one this transformers can build."""
    if "auto_map" not in hf and kind != "diffusion_gemma":
        return [(f"transformers cannot load this export: a {kind} model has no Hugging Face modeling code; load it "
                 "with tcsm.from_pretrained (or tcsm sample / tcsm eval / train.init_from)")]  # fmt: skip
    if kind != "hf_denoiser":  # a DiffusionGemma export is the model's own directory
        return []
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


#: names for the masked source's input V in an exported tokenizer, the first one the run's vocabulary lacks
MASK_NAMES = ("[MASK]", "<|mask|>", "<|tcsm_mask|>")


def _run_tokenizer_config(places) -> dict:
    """The first tokenizer_config.json of `places` (a run's, written by the trainer; an export's), else {}."""
    for where in places:
        f = where / "tokenizer_config.json" if where is not None else None
        if f is not None and f.is_file():
            try:
                value = json.loads(f.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(value, dict):
                return value
    return {}


def _chat_template(places) -> str | None:
    """The chat template an instruction run was trained with (its chat_template.jinja; an export's config)."""
    for where in places:
        if where is not None and (where / "chat_template.jinja").is_file():
            return (where / "chat_template.jinja").read_text(encoding="utf-8")
    template = _run_tokenizer_config(places).get("chat_template")
    return template if isinstance(template, str) else None


def _token_name(value) -> str | None:
    value = value.get("content") if isinstance(value, dict) else value
    return value if isinstance(value, str) else None


def _special_tokens(tokenizer_file: Path, places, mask: bool, V: int) -> tuple[dict, list[str]]:
    """(tokenizer_config entries, notes) naming the run's real special tokens: its end-of-text and padding tokens
    (as the run recorded them, else the usual names its vocabulary holds), its unknown token, and for the masked
    source a mask token that transformers adds at id V, the model's [MASK] input (a name the vocabulary lacks:
    a BERT vocabulary's own [MASK] is a clean token < V). A name the vocabulary lacks is never given for the others,
    since transformers would add it as a new token, colliding with V."""
    from tcsm.data.tokenizer_spec import EOS_CANDIDATES

    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tokenizer_file))
    except Exception:  # noqa: BLE001  (no tokenizers package, or a file it cannot read: name nothing)
        return {}, ["the tokenizer could not be read to name its special tokens"]
    vocab = tok.get_vocab(with_added_tokens=True)
    recorded = _run_tokenizer_config(places)
    out: dict = {}
    for key, candidates in (("eos_token", EOS_CANDIDATES), ("pad_token", ("<pad>", "[PAD]", "<|pad|>"))):
        name = _token_name(recorded.get(key))
        if name not in vocab:
            name = next((c for c in candidates if c in vocab), None)
        if name is not None:
            out[key] = name
    if "pad_token" not in out and "eos_token" in out:
        out["pad_token"] = out["eos_token"]  # what the run pads with (tcsm.data.tokenizer_spec)
    unk = json.loads(tok.to_str()).get("model", {}).get("unk_token")
    if isinstance(unk, str) and unk in vocab:
        out["unk_token"] = unk
    notes = []
    if mask:
        if len(vocab) == V:
            out["mask_token"] = next(n for n in MASK_NAMES if n not in vocab)
        else:
            notes.append(f"the tokenizer has {len(vocab)} tokens for V = {V}: its mask token (id {V}) is not named")
    return out, notes


def _special_ids(tmp: Path) -> dict:
    """{eos_token_id, pad_token_id} of the exported tokenizer's named special tokens (for config.json)."""
    try:
        named = json.loads((tmp / "tokenizer_config.json").read_text(encoding="utf-8"))
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tmp / "tokenizer.json"))
    except Exception:  # noqa: BLE001  (no tokenizer exported, or no tokenizers package: nothing to name)
        return {}
    out = {}
    for key in ("eos", "pad"):
        name = named.get(f"{key}_token")
        i = tok.token_to_id(name) if isinstance(name, str) else None
        if i is not None:
            out[f"{key}_token_id"] = int(i)
    return out


def _write_tokenizer(tmp: Path, ck, run_dir: Path | None, mask: bool) -> list[str]:
    """The run's tokenizer as tokenizer.json (a character vocabulary as a tokenizers file, a BPE run's own file —
    saved in its run directory, or the export it came from — else rebuilt from the run's data section) and
    tokenizer_config.json naming its real special tokens and the run's chat template; returns notes for the user."""
    chars = ck.data_info.get("chars")
    places = [run_dir, ck.directory]
    V = int(ck.data_info["vocab_size"])
    # transformers.AutoTokenizer reads tokenizer.json through this class; [MASK] is the masked source's input V.
    special: dict = {"tokenizer_class": "PreTrainedTokenizerFast"}
    notes: list[str] = []
    if chars:
        (tmp / "tokenizer.json").write_text(json.dumps(char_tokenizer_json(chars, mask)), encoding="utf-8")
        if mask:
            special["mask_token"] = "[MASK]"
    else:
        found = [w / "tokenizer.json" for w in places if w is not None and (w / "tokenizer.json").is_file()]
        if found:
            shutil.copyfile(found[0], tmp / "tokenizer.json")
        else:
            tok = getattr(ck.build_data(), "tokenizer", None)
            if not hasattr(tok, "save"):
                return ["the run's data has no text tokenizer (token ids are the data): no tokenizer is exported"]
            tok.save(tmp / "tokenizer.json")
        names, notes = _special_tokens(tmp / "tokenizer.json", places, mask, V)
        special.update(names)
    template = _chat_template(places)
    if template is not None:
        special["chat_template"] = template
        (tmp / "chat_template.jinja").write_text(template, encoding="utf-8")
    (tmp / "tokenizer_config.json").write_text(json.dumps(special, indent=1) + "\n", encoding="utf-8")
    return notes
