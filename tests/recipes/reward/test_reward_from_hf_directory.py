"""`tcsm finetune reward --from DIR` on a DiffusionGemma directory: the import brings the model and its tokenizer, no
text, so a reward run with no data is refused in one line naming the data to give (a text reward is not refused
for the import's data kind: it is decoded with the directory's own tokenizer)."""

from __future__ import annotations

import pytest
from diffusion_gemma_helpers import write_dgemma_dir
from train_helpers import restore_torch_threads  # noqa: F401

from tcsm.cli import main

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")


def test_reward_from_a_directory_without_data_names_the_data_to_give(tmp_path, monkeypatch, capsys):
    write_dgemma_dir(tmp_path / "dgemma")
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()  # transformers' own progress lines while the directory was written
    rc = main(["finetune", "reward", "--from", "dgemma", "--reward", "vader", "-o", "runs/rw", "--steps", "2",
               "train.device=cpu", "train.threads=1", "train.progress=false", "train.precision=fp32", "sample.num=0",
               "train.batch_size=4"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0
    assert len(err) == 1 and "holds no text to read a train split from" in err[0] and "tcsm prepare" in err[0], err
    assert "scores decoded text" not in err[0]
