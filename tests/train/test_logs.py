"""train.logger: TensorBoard, Weights & Biases (offline: no network) and plain JSONL get the same rows and the run's
config; metrics.jsonl is written whichever is chosen."""

from __future__ import annotations

import json

import pytest
from train_helpers import restore_torch_threads, tiny  # noqa: F401

from tcsm.builders.config import load_config
from tcsm.core.errors import ConfigError
from tcsm.train.logs import read_metrics
from tcsm.train.trainer import Trainer


def _records(raw: bytes, block: int = 32768) -> bytes:
    """The concatenated record payloads of a W&B transaction log (LevelDB log format after a 7-byte file header:
    32 KiB blocks of chunks, each with a 7-byte header), in which protobuf records carry our keys in clear. Without
    this, a key that straddles a block boundary would be cut by a chunk header."""
    out, pos = bytearray(), 7
    while pos + 7 <= len(raw):
        left = block - pos % block
        if left < 7:  # block trailer padding
            pos += left
            continue
        length = int.from_bytes(raw[pos + 4 : pos + 6], "little")
        out += raw[pos + 7 : pos + 7 + length]
        pos += 7 + length
    return bytes(out)


def _fit(run_dir, *extra):
    cfg = load_config("synthetic", tiny("train.steps=3", "train.eval_every=3", *extra))
    return Trainer.from_config(cfg, run_dir, log=lambda s: None).fit()


def test_wandb_offline_gets_the_metrics_the_samples_and_the_config(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="Weights & Biases is the optional tcsm[wandb] extra")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    _fit(tmp_path, "train.logger=wandb", "train.tensorboard=true")
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and not (tmp_path / "tensorboard").exists()
    (record,) = runs[0].glob("run-*.wandb")
    raw = _records(record.read_bytes())
    rows = read_metrics(tmp_path)
    for kind in ("train", "valid"):
        numbers = (k for r in rows if r["kind"] == kind for k, v in r.items() if isinstance(v, (int, float)))
        keys = set(numbers) - {"step", "time"}
        assert keys and all(f"{kind}/{k}".encode() in raw for k in keys), kind
    assert b"batch_size" in raw and b"synthetic" in raw  # the run's config
    (table,) = (runs[0] / "files" / "media" / "table").glob("samples_*.json")
    logged = [row[0] for row in json.loads(table.read_text())["data"]]
    assert logged == json.loads((tmp_path / "samples.jsonl").read_text().splitlines()[-1])["samples"]
    assert (tmp_path / "wandb_id.txt").read_text().strip() in runs[0].name  # a resume continues this W&B run


def test_jsonl_logger_writes_only_the_run_files(tmp_path):
    _fit(tmp_path, "train.logger=jsonl", "train.tensorboard=true")
    assert not (tmp_path / "tensorboard").exists() and not (tmp_path / "wandb").exists()
    assert [r["step"] for r in read_metrics(tmp_path) if r["kind"] == "train"] == [1, 2, 3]


def test_tensorboard_logger_gets_scalars_and_the_config(tmp_path):
    pytest.importorskip("tensorboard", reason="TensorBoard is the optional tcsm[log] extra")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _fit(tmp_path, "train.logger=tensorboard", "train.tensorboard=true")
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0}).Reload()
    assert "train/loss" in events.Tags()["scalars"] and "valid/bpc" in events.Tags()["scalars"]
    assert any(tag.startswith("config") for tag in events.Tags()["tensors"])


def test_an_unknown_logger_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="train.logger must be one of"):
        _fit(tmp_path, "train.logger=mlflow")
