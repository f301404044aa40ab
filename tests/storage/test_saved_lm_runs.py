"""A run saved while the LM objective was named `clean_lm` (objective.name in its checkpoint's config) loads and
resumes as `objective.name: lm`, silently (storage/migration.py MOVED_VALUES)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from train_helpers import restore_torch_threads, tiny  # noqa: F401

from tcsm.cli import main
from tcsm.storage.checkpoint import read_state, resolve_checkpoint


def _rename_objective_as_saved_before(run: Path) -> Path:
    """Rewrite the run's latest checkpoint (state.json, config.yaml and their manifest hashes) and the run's
    config.yaml with `objective.name: clean_lm`, as a run written before the rename holds it."""
    ckpt = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    meta = json.loads((ckpt / "state.json").read_text())
    assert meta["state"]["config"]["objective"]["name"] == "lm"
    meta["state"]["config"]["objective"]["name"] = "clean_lm"
    (ckpt / "state.json").write_text(json.dumps(meta))
    for yaml_file in (ckpt / "config.yaml", run / "config.yaml"):
        text = yaml_file.read_text()
        assert text.count("  name: lm\n") == 1
        yaml_file.write_text(text.replace("  name: lm\n", "  name: clean_lm\n"))
    manifest = json.loads((ckpt / "manifest.json").read_text())
    for name in ("state.json", "config.yaml"):
        data = (ckpt / name).read_bytes()
        manifest["files"][name] = {
            **manifest["files"][name],
            "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data),
        }
    (ckpt / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return ckpt


def test_a_run_saved_with_objective_clean_lm_loads_and_resumes(tmp_path, capsys):
    run = tmp_path / "ar"
    keys = [
        o
        for o in tiny("train.eval_every=0", "train.sample_every=0")
        if not o.startswith(("model.cond_dim", "eval.num_t"))
    ]
    assert (
        main(
            [
                "train",
                "-o",
                str(run),
                "model.name=causal",
                "model.preset=tiny",
                "objective.name=lm",
                *keys,
                "train.steps=2",
            ]
        )
        == 0
    )
    ckpt = _rename_objective_as_saved_before(run)
    assert read_state(resolve_checkpoint(ckpt))[1]["config"]["objective"]["name"] == "lm"
    capsys.readouterr()
    assert main(["train", "-o", str(run), "--resume", "train.steps=3"]) == 0
    assert "note" not in capsys.readouterr().err
    assert json.loads((run / "summary.json").read_text())["step"] == 3
