"""A new Hugging Face model family is one module plus one registration (DESIGN.md "A new model family"): the module
below declares its kind, its network (a tiny transformers BERT as a masked denoiser), its registry entry and its
exporter through the public registries; the run's `plugins:` line registers it, so `tcsm train`, then `tcsm sample`
and `tcsm export` in fresh processes that import nothing first, train, sample and export it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from train_helpers import restore_torch_threads, tiny  # noqa: F401

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

FAMILY = textwrap.dedent('''
    from dataclasses import dataclass, field

    from torch import nn

    from tcsm.builders.exporters import EXPORTERS, Exporter
    from tcsm.builders.registry import MODELS
    from tcsm.core.errors import ConfigError
    from tcsm.models.kinds import ModelKind

    TOY_BERT = ModelKind("denoiser", "path", "toy_bert", "a tiny BERT as a masked denoiser")


    @dataclass
    class ToyBertNetConfig:
        vocab_size: int
        num_states: int
        max_len: int
        time_conditioning: bool = False


    class ToyBert(nn.Module):
        """x_t [B, L] (ids <= V, V = [MASK]) -> logits [B, L, V]; no time input (the masked posterior ignores t)."""

        model_kind = TOY_BERT

        def __init__(self, vocab_size, max_len, hidden):
            from transformers import BertConfig, BertForMaskedLM

            super().__init__()
            self.cfg = ToyBertNetConfig(vocab_size, vocab_size + 1, max_len)
            self.hf = BertForMaskedLM(BertConfig(vocab_size=vocab_size + 1, hidden_size=hidden, num_hidden_layers=1,
                                                 num_attention_heads=2, intermediate_size=2 * hidden,
                                                 max_position_embeddings=max_len))

        def forward(self, xt, t=None):
            return self.hf(input_ids=xt).logits[..., : self.cfg.vocab_size].float()


    @dataclass
    class ToyBertConfig:
        name: str = "toy_bert"
        hidden: int = field(default=16, metadata={"help": "BERT width"})


    @MODELS.register("toy_bert", schema=ToyBertConfig, kind=TOY_BERT, help="a tiny BERT as a masked denoiser")
    def build_toy_bert(node, ctx):
        if ctx.path.num_states != ctx.path.vocab_size + 1:
            raise ConfigError("toy_bert is a masked denoiser: set path.source=masked")
        return ToyBert(ctx.vocab_size, ctx.seq_len, int(node["hidden"]))


    @EXPORTERS.register
    class ToyBertExporter(Exporter):
        name = "toy_bert"

        def card_lines(self, hf):
            return ["A toy BERT denoiser: `tcsm.from_pretrained(DIR)` loads it."]
''')


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    root = tmp_path_factory.mktemp("family")
    (root / "toy_family.py").write_text(FAMILY)
    return root


def _tcsm(root, *argv):
    """The command line in a fresh process that imports nothing first: the run's `plugins:` registers the family."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    return subprocess.run([sys.executable, "-m", "tcsm.cli", *map(str, argv)], cwd=root, env=env, capture_output=True,
                          check=False, text=True, timeout=600)  # fmt: skip


def test_a_new_family_trains_samples_and_exports_from_the_command_line(family):
    run, out = family / "run", family / "export"
    overrides = [o for o in tiny("data.vocab_size=8", "data.seq_len=8", "train.steps=2", "train.eval_every=0", "train.sample_every=0",
                                 "sample.num=0", "sample.steps=2") if not o.startswith("model.")]  # fmt: skip
    done = _tcsm(family, "train", "-o", run, "plugins=[toy_family]", "model.name=toy_bert", "model.hidden=16",
                 *overrides)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "name: toy_bert" in (run / "config.yaml").read_text()

    sampled = _tcsm(family, "sample", run, "-n", 2, "--format", "jsonl", "--no-progress")
    assert sampled.returncode == 0, sampled.stderr
    rows = [json.loads(line) for line in sampled.stdout.splitlines()]
    assert len(rows) == 2 and all(len(r["tokens"]) == 8 and max(r["tokens"]) < 8 for r in rows)  # clean ids < V

    exported = _tcsm(family, "export", run, "-o", out)
    assert exported.returncode == 0, exported.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["kind"] == "toy_bert" and "auto_map" not in config  # its own exporter, no tcsm modeling code
    assert "A toy BERT denoiser" in (out / "README.md").read_text()
    again = _tcsm(family, "sample", out, "-n", 1, "--format", "jsonl", "--no-progress")  # the export loads back
    assert again.returncode == 0, again.stderr
    assert len(again.stdout.splitlines()) == 1
