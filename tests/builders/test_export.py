"""`tcsm export`: a run leaves tcsm as a Hugging Face-style directory and comes back exactly, three ways —
`tcsm.from_pretrained` (bit for bit), `transformers.AutoModelForMaskedLM` / `AutoModel` with trust_remote_code
(fp32, ≤ 1e-5; the modeling code imports no tcsm) and `train.init_from` — for masked, uniform time-conditioned
and energy (DRE) runs; `tcsm sample` / `tcsm eval` read the directory; bad directories fail in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from train_helpers import cli_env, restore_torch_threads, tiny  # noqa: F401

import tcsm
from tcsm.builders.config import load_config
from tcsm.builders.loading import load_checkpoint
from tcsm.cli import main
from tcsm.cli.train import train
from tcsm.core.errors import CheckpointError
from tcsm.train import Trainer

transformers = pytest.importorskip("transformers")

RUNS = {
    "masked": ("path.source=masked", "model.time_conditioning=false"),
    "uniform_timed": ("path.source=uniform", "model.time_conditioning=true"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    out = {}
    with torch.random.fork_rng(devices=[]):
        for name, extra in RUNS.items():
            cfg = load_config("synthetic", tiny("train.steps=6", "train.eval_every=6", "sample.num=0", *extra))
            train(cfg, root / name, log=lambda s: None)
            out[name] = root / name
    return out


def _inputs(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    V, S = model.cfg.vocab_size, model.cfg.num_states
    return torch.randint(0, S, (3, 16), generator=g), torch.rand(3, generator=g), V


@pytest.mark.parametrize("name", list(RUNS))
def test_three_loading_routes_give_the_runs_logits(runs, tmp_path, name):
    run = runs[name]
    out = tcsm.export(run, tmp_path / "hf")
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "modeling_tcsm.py", "configuration_tcsm.py", "README.md",
            "sampling_config.json", "manifest.json"} <= files  # fmt: skip
    meta = json.loads((out / "config.json").read_text())
    assert meta["model_type"] == "tcsm" and "AutoModelForMaskedLM" in meta["auto_map"]
    ref = load_checkpoint(run).model
    xt, t, _ = _inputs(ref)
    want = ref(xt, t)
    # 1. tcsm, no transformers: bit for bit
    assert torch.equal(tcsm.from_pretrained(out)(xt, t), want)
    # 2. transformers with the exported modeling code
    hf = transformers.AutoModelForMaskedLM.from_pretrained(str(out), trust_remote_code=True).eval()
    with torch.no_grad():
        got = hf(input_ids=xt, timesteps=t).logits
    torch.testing.assert_close(got, want.detach(), atol=1e-5, rtol=0)
    # 3. a training start: the trainer's model before step 1 holds the exported weights
    cfg = load_config("synthetic", tiny("train.steps=1", *RUNS[name], f"train.init_from={out}"))
    trainer = Trainer.from_config(cfg, None, log=lambda s: None)
    assert torch.equal(trainer.model.eval()(xt, t), want)
    # the card carries the run's measured figures
    card = (out / "README.md").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert f"{summary['bpc']:.4f} ± {summary['bpc_stderr']:.4f}" in card and summary["bound"] in card


def test_export_loads_with_transformers_where_tcsm_is_not_installed(runs, tmp_path):
    """The remote code is self-contained: with `import tcsm` made impossible, transformers still loads the
    directory and gives the logits saved beside it."""
    out = tcsm.export(runs["uniform_timed"], tmp_path / "hf")
    ref = tcsm.from_pretrained(out)
    xt, t, _ = _inputs(ref)
    torch.save({"xt": xt, "t": t, "logits": ref(xt, t).detach()}, tmp_path / "case.pt")
    code = (
        "import sys, torch; sys.modules['tcsm'] = None\n"
        "from transformers import AutoModelForMaskedLM\n"
        f"c = torch.load({str(tmp_path / 'case.pt')!r})\n"
        f"m = AutoModelForMaskedLM.from_pretrained({str(out)!r}, trust_remote_code=True)\n"
        "d = (m(input_ids=c['xt'], timesteps=c['t']).logits - c['logits']).abs().max().item()\n"
        "assert d <= 1e-5, d\nprint('ok', d)\n"
    )
    env = cli_env()
    env["PYTHONPATH"] = ""  # not the source tree; the venv's editable install is blocked by sys.modules above
    res = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env, timeout=240,
                         cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-2000:]


def test_energy_run_exports_with_its_reference(runs, tmp_path):
    rc = main(["finetune", "dre", "--from", str(runs["masked"]), "-o", str(tmp_path / "ii"), "--loss", "bce",
               "-n", "2", "--steps", "3", "--eval-examples", "8", "train.progress=false", "train.tensorboard=false",
               "train.batch_size=8", "train.device=cpu", "train.threads=1", "eval.num_t=2", "sample.num=0",
               "objective.log_z_samples=[1,4]"])  # fmt: skip
    assert rc == 0
    out = tcsm.export(tmp_path / "ii", tmp_path / "hf")
    ref = load_checkpoint(tmp_path / "ii").model
    x1 = torch.randint(0, ref.reference.vocab_size, (3, 16))
    xt, t, _ = _inputs(ref.reference)
    back = tcsm.from_pretrained(out)
    assert type(back).__name__ == "EnergyModel"
    assert torch.equal(back(x1, xt, t), ref(x1, xt, t))
    assert torch.equal(back.reference(xt, t), ref.reference(xt, t))
    hf = transformers.AutoModel.from_pretrained(str(out), trust_remote_code=True).eval()
    with torch.no_grad():
        res = hf(input_ids=x1, noisy_ids=xt, timesteps=t)
    torch.testing.assert_close(res.energy, ref(x1, xt, t).detach(), atol=1e-5, rtol=0)
    torch.testing.assert_close(res.logits, ref.reference(xt, t).detach(), atol=1e-5, rtol=0)
    from tcsm.builders.config import to_dict

    cfg = load_config(base=to_dict(load_checkpoint(tmp_path / "ii").config), overrides=[f"train.init_from={out}"])
    trainer = Trainer.from_config(cfg, None, log=lambda s: None)
    assert torch.equal(trainer.model.eval()(x1, xt, t), ref(x1, xt, t))
    assert main(["sample", str(out), "-n", "2", "--steps", "4"]) == 0  # SIR over the exported reference


def test_sample_and_eval_read_an_export(runs, tmp_path, capsys):
    out = tcsm.export(runs["masked"], tmp_path / "hf")
    assert main(["sample", str(out), "-n", "2", "--steps", "4", "--seed", "3", "--format", "jsonl",
                 "-o", str(tmp_path / "a.jsonl")]) == 0  # fmt: skip
    assert main(["sample", str(runs["masked"]), "-n", "2", "--steps", "4", "--seed", "3", "--format", "jsonl",
                 "-o", str(tmp_path / "b.jsonl")]) == 0  # fmt: skip
    tokens = [[json.loads(r)["tokens"] for r in (tmp_path / f).read_text().splitlines()] for f in ("a.jsonl", "b.jsonl")]
    assert tokens[0] == tokens[1]
    capsys.readouterr()
    assert main(["eval", str(out), "--json", "--num-t", "2", "--max-examples", "8", "--device", "cpu"]) == 0
    a = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(["eval", str(runs["masked"]), "--json", "--num-t", "2", "--max-examples", "8", "--device", "cpu"]) == 0
    b = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert a["bpc"] == b["bpc"]


def test_cli_export_reexport_and_refusals(runs, tmp_path, capsys):
    out = tmp_path / "hf"
    assert main(["export", str(runs["masked"]), "-o", str(out)]) == 0
    # exporting an export is exact; replacing an export needs --overwrite
    assert main(["export", str(out), "-o", str(tmp_path / "again")]) == 0
    a, b = tcsm.from_pretrained(out), tcsm.from_pretrained(tmp_path / "again")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    capsys.readouterr()
    assert main(["export", str(runs["masked"]), "-o", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["export", str(runs["masked"]), "-o", str(out), "--overwrite"]) == 0
    # a directory holding something else is never replaced
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    assert main(["export", str(runs["masked"]), "-o", str(other), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "does not hold a tcsm export" in err
    assert (other / "notes.txt").read_text() == "keep" and not list(tmp_path.glob(".tmp-export-*"))


def test_a_failed_export_leaves_the_old_one(runs, tmp_path, monkeypatch):
    out = tcsm.export(runs["masked"], tmp_path / "hf")
    before = (out / "model.safetensors").read_bytes()
    import tcsm.builders.export as ex
    from tcsm.builders import exporters

    def broken(*a, **k):
        raise OSError("No space left on device")

    monkeypatch.setattr(exporters, "save_file", broken)  # the family's exporter writes the weights
    with pytest.raises(CheckpointError, match="the disk is full"):  # one line for the CLI, not a traceback
        ex.export(runs["uniform_timed"], out, overwrite=True)
    assert (out / "model.safetensors").read_bytes() == before
    assert not list(tmp_path.glob(".tmp-export-*"))


def test_not_an_export_and_a_foreign_tokenizer_are_one_line_errors(runs, tmp_path, capsys):
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(CheckpointError, match="is a Hugging Face 'bert' model, not a tcsm export"):
        tcsm.from_pretrained(bert)
    assert main(["sample", str(bert)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    out = tcsm.export(runs["masked"], tmp_path / "hf")
    tok = {"model": {"type": "BPE", "vocab": {c: i for i, c in enumerate("abcdefghijkl")}, "merges": []}}
    (out / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(CheckpointError, match="tokenizer.json has 12 tokens but the model was trained on 8"):
        tcsm.from_pretrained(out)
    (out / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="incomplete"):
        tcsm.from_pretrained(out)


def test_char_tokenizer_file_matches_the_runs_tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    from tcsm.builders.export import char_tokenizer_json
    from tcsm.data.base import CharTokenizer

    chars, text = " \nabcé", "ab c\né a"
    tok = tokenizers.Tokenizer.from_str(json.dumps(char_tokenizer_json(chars, mask=True)))
    assert tok.encode(text).ids == CharTokenizer(chars).encode(text)
    assert tok.decode(tok.encode(text).ids) == text and tok.token_to_id("[MASK]") == len(chars)


def test_a_recipe_starts_from_an_export(runs, tmp_path):
    """`--from EXPORT`: the reference and the start are the exported weights (strategy i: log r ≡ 0 at step 1)."""
    out = tcsm.export(runs["masked"], tmp_path / "hf")
    rc = main(["finetune", "dre", "--from", str(out), "-o", str(tmp_path / "i"), "--strategy", "i", "--loss", "bce",
               "--steps", "1", "--eval-examples", "4", "train.progress=false", "train.tensorboard=false",
               "train.log_every=1", "train.batch_size=8", "train.device=cpu", "train.threads=1", "eval.num_t=2",
               "sample.num=0"])  # fmt: skip
    assert rc == 0
    first = next(json.loads(r) for r in (tmp_path / "i" / "metrics.jsonl").read_text().splitlines()
                 if json.loads(r)["kind"] == "train")  # fmt: skip
    assert first["log_r_data"] == 0.0 and first["accuracy"] == 0.5


def test_the_load_line_of_an_export_is_its_familys():
    """`tcsm export` says what loads an export from the family's exporter (by config.json's kind), never by
    comparing a model type string."""
    from tcsm.builders.exporters import exporter_named

    dg = {"model_type": "diffusion_gemma", "kind": "diffusion_gemma"}
    assert "DiffusionGemmaForBlockDiffusion" in exporter_named(dg["kind"]).loads_with(dg)
    remote = {"model_type": "tcsm", "kind": "denoiser", "auto_map": {"AutoModelForMaskedLM": "modeling_tcsm.X"}}
    assert "trust_remote_code=True" in exporter_named("denoiser").loads_with(remote)
    assert exporter_named("causal").loads_with({"kind": "causal"}) == "tcsm.from_pretrained"
    assert exporter_named(None).loads_with({}) == "tcsm.from_pretrained"
