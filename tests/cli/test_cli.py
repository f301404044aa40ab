"""`tcsm train | eval | quickstart` in-process through `main([...])`: outputs, help, and a one-line error with a
non-zero exit (never a traceback) for every mistake a user can make."""

from __future__ import annotations

import gzip
import json

import pytest
from train_helpers import restore_torch_threads, run_cli, tiny  # noqa: F401

from tcsm.cli import COMMANDS, main

QUIET = ("train.eval_every=0", "train.sample_every=0")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny trained run shared by the eval tests."""
    run = tmp_path_factory.mktemp("run")
    assert main(["train", "-o", str(run), *tiny(*QUIET, "train.steps=3")]) == 0
    return run


def _error(capsys, argv) -> str:
    """Run argv; assert a non-zero exit with exactly one line on stderr and no traceback; return the line."""
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_train_writes_a_complete_run(tmp_path, capsys):
    run = tmp_path / "run"
    assert (
        main(["train", "-o", str(run), *tiny("train.steps=4", "train.eval_every=2", "train.save_every=2")])
        == 0
    )
    out = capsys.readouterr().out
    assert "bits/token" in out and f"run directory: {run}" in out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["step"] == 4 and summary["bpc"] > 0
    assert {p.name for p in (run / "checkpoints").iterdir()} >= {"latest", "step_00000002", "step_00000004"}
    assert (run / "metrics.jsonl").is_file() and (run / "samples.jsonl").is_file()


def test_eval_reports_the_bound_as_text_and_json(trained, capsys):
    assert main(["eval", str(trained), "--max-examples", "8", "--num-t", "2"]) == 0
    assert "bits/token" in capsys.readouterr().out
    out_file = trained / "eval.json"
    assert (
        main(
            [
                "eval",
                str(trained),
                "--json",
                "--split",
                "test",
                "--weights",
                "model",
                "--output",
                str(out_file),
            ]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert result["split"] == "test" and result["weights"] == "model" and result["step"] == 3
    assert result["num_sequences"] == 32 and result["bpc"] > result["floor_bpc"] * 0.5
    assert json.loads(out_file.read_text())["bpc"] == result["bpc"]


def _clean_run(run, family: str, *extra: str) -> list[str]:
    """`tcsm train` arguments of a tiny LM run (no denoiser-only keys)."""
    keys = [o for o in tiny(*QUIET, "train.steps=3") if not o.startswith(("model.cond_dim", "eval.num_t"))]
    head = ["train", "-o", str(run), f"model.name={family}", "model.preset=tiny", "objective.name=lm"]
    return head + keys + list(extra)


@pytest.mark.parametrize(
    "family, metric", [("causal", "ar-nll"), ("hollow", "pseudo-nll"), ("mlm", "pseudo-nll")]
)
def test_clean_model_runs_sample_and_eval_with_their_own_metric(tmp_path, capsys, family, metric):
    """sample.num > 0 on an LM run: the AR model logs ancestral samples, the others skip sampling with one
    line; `tcsm eval` then reports the objective's NLL / pseudo-NLL (the trainer's validation) in the bound's keys."""
    run = tmp_path / family
    assert main(_clean_run(run, family, "sample.num=2")) == 0
    out = capsys.readouterr().out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["bound"] == metric
    if family == "causal":
        assert "step 3: samples" in out and "sampling skipped" not in out
        rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
        assert len(rows[-1]["samples"]) == 2
    else:
        assert out.count("sampling skipped") == 1 and ": samples" not in out
    assert main(["eval", str(run), "--json", "--max-examples", "16"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["bound"] == metric and "num_t" not in result
    assert {"nats_per_token", "bpc", "bpc_stderr", "perplexity", "num_sequences"} <= set(result)
    assert result["num_sequences"] == 16 and result["bpc"] == pytest.approx(summary["bpc"], rel=1e-5)
    assert main(["eval", str(run), "--max-examples", "4"]) == 0
    label = {"ar-nll": "exact NLL", "pseudo-nll": "pseudo-NLL"}[metric]  # neither is a likelihood bound
    assert f"[{label}, 4 sequences]" in capsys.readouterr().out


def test_help_lists_presets_and_config_keys(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for text in (
        "synthetic",
        "text8-prefix-small",
        "text8-paper",
        "train.steps=2500",  # the synthetic preset's: what a plain `tcsm train` runs
        "optim.lr=",
        "model.preset=",
    ):
        assert text in out
    assert main([]) == 0 and "quickstart" in capsys.readouterr().out
    assert {"train", "eval", "quickstart"} <= set(COMMANDS)


def test_print_config_applies_preset_and_overrides(capsys):
    assert (
        main(
            [
                "train",
                "--config",
                "text8-prefix-small",
                "--print-config",
                "train.steps=7",
                "path.source=uniform",
                "objective.loss=score",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "steps: 7" in out and "source: uniform" in out and "loss: score" in out and "preset: small" in out


def test_config_mistakes_are_one_line_errors(tmp_path, capsys):
    out = ["train", "-o", str(tmp_path / "x")]
    assert "unknown config key 'train.stepz'" in _error(capsys, out + ["train.stepz=3"])
    assert "did you mean" in _error(capsys, out + ["optim.lrr=1"])
    assert "'train.steps'" in _error(capsys, out + ["train.steps=abc"])
    assert "unknown config section" in _error(capsys, out + ["trian.steps=3"])
    assert "not of the form" in _error(capsys, out + ["train.steps"])
    assert "unknown preset 'nope'" in _error(capsys, out + ["--config", "nope"])
    assert "train.precision" in _error(capsys, out + ["train.precision=fp16"])
    assert "path.source" in _error(capsys, out + ["path.source=gaussian"])
    assert "unknown model.preset" in _error(capsys, out + tiny("model.preset=huge"))
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("train: [unclosed\n")
    assert "not valid YAML" in _error(capsys, out + ["--config", str(bad_yaml)])
    assert "cannot read config file" in _error(capsys, out + ["--config", str(tmp_path / "missing.yaml")])


def test_data_mistakes_are_one_line_errors(tmp_path, capsys):
    out = ["train", "-o", str(tmp_path / "x")]
    text = ["data.kind=text", "data.seq_len=8"]
    assert "not found" in _error(
        capsys, out + tiny(*text, f"data.path={tmp_path / 'none.txt'}", synthetic=False)
    )
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert "empty" in _error(capsys, out + tiny(*text, f"data.path={empty}", synthetic=False))
    corrupt = tmp_path / "corrupt.txt.gz"
    corrupt.write_bytes(b"\x1f\x8bnot really gzip")
    assert "cannot read" in _error(capsys, out + tiny(*text, f"data.path={corrupt}", synthetic=False))
    oov = tmp_path / "oov.txt"
    oov.write_text("abcabcabcabd" * 50)
    assert "outside the" in _error(
        capsys, out + tiny(*text, f"data.path={oov}", "data.vocab=abc", synthetic=False)
    )
    assert "unknown data.kind" in _error(capsys, out + ["data.kind=images"])
    assert "unknown config key 'data.pth'" in _error(capsys, out + [f"data.pth={oov}"])


def test_sequence_longer_than_the_model_allows(tmp_path, capsys):
    line = _error(capsys, ["train", "-o", str(tmp_path / "x"), *tiny("data.seq_len=32", "model.max_len=16")])
    assert "length 32" in line and "at most 16" in line


def test_checkpoint_mistakes_are_one_line_errors(trained, tmp_path, capsys):
    assert "does not exist" in _error(capsys, ["eval", str(tmp_path / "missing")])
    assert "no checkpoint" in _error(capsys, ["eval", str(tmp_path)])
    assert "model.n_layers" in _error(capsys, ["eval", str(trained), "model.n_layers=3"])
    assert "model.d_model" in _error(
        capsys, ["train", "-o", str(trained), "--resume", *tiny(*QUIET, "train.steps=5", "model.d_model=64")]
    )
    assert "--resume needs" in _error(capsys, ["train", "--resume"])
    # A corrupt single checkpoint: the error names it instead of loading garbage.
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(trained, broken)
    step_dir = broken / "checkpoints" / "step_00000003"
    data = bytearray((step_dir / "model.safetensors").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (step_dir / "model.safetensors").write_bytes(bytes(data))
    assert "corrupt" in _error(capsys, ["eval", str(broken)])
    assert "corrupt" in _error(capsys, ["eval", str(step_dir)])


def test_eval_refuses_data_with_another_vocabulary(tmp_path, capsys):
    corpus = tmp_path / "c.txt.gz"
    with gzip.open(corpus, "wt") as f:
        f.write("hello world " * 400)
    run = tmp_path / "run"
    args = tiny(
        *QUIET, "train.steps=1", "data.kind=text", f"data.path={corpus}", "data.seq_len=16", synthetic=False
    )
    assert main(["train", "-o", str(run), *args]) == 0
    other = tmp_path / "o.txt"
    other.write_text("abcdefghijklmnopq " * 400)
    assert "vocabulary" in _error(capsys, ["eval", str(run), f"data.path={other}"])


def test_quickstart_end_to_end_in_miniature(tmp_path, capsys):
    run = tmp_path / "qs"
    assert (
        main(
            [
                "quickstart",
                "-o",
                str(run),
                *tiny("train.steps=3", "train.eval_every=0", "train.sample_every=0", "eval.max_examples=16"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "source entropy" in out and "model bound" in out and "samples' NLL" in out


def test_console_script_runs_as_a_subprocess(tmp_path):
    """`python -m tcsm.cli` (what `tcsm` and torchrun run) exits non-zero with one stderr line on errors."""
    result = run_cli("train", "-o", str(tmp_path / "x"), "train.steps=oops")
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0
    assert result.stderr.startswith("tcsm train: error: config key 'train.steps'")


def test_bad_command_line_arguments_are_one_line_errors(capsys):
    for argv in (["train", "--bogus"], ["nope"], ["eval"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and err.count("\n") == 0 and "error:" in err
