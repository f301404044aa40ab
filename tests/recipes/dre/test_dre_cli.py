"""`tcsm finetune dre` end to end on a tiny synthetic reference run (seconds): both strategies start exactly at the
reference, the reference never changes, runs resume exactly, an energy run is self-contained (sampled and evaluated
after its reference run is gone, the estimate labelled as such), and a mismatched reference is refused in one line."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from train_helpers import assert_same_weights, final_weights, restore_torch_threads, tiny  # noqa: F401

import tcsm
from tcsm.builders.config import load_config
from tcsm.cli import main
from tcsm.cli.train import train

FT = [
    "train.progress=false",
    "train.tensorboard=false",
    "train.log_every=1",
    "train.eval_examples=8",
    "train.batch_size=8",
    "train.device=cpu",
    "train.threads=1",
    "eval.num_t=2",
    "sample.num=0",
    "objective.log_z_samples=[1,4]",
]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("dre")
    with torch.random.fork_rng(devices=[]):
        cfg = load_config("synthetic", tiny("train.steps=15", "train.eval_every=0", "sample.num=0"))
        train(cfg, root / "ref", log=lambda s: None)
    return root / "ref"


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _finetune(reference, out, *extra) -> int:
    # argparse takes the key=value overrides as one run of positionals: after every flag.
    flags = [a for a in extra if "=" not in a or a.startswith("-")]
    overrides = [a for a in extra if a not in flags]
    return main(["finetune", "dre", "--from", str(reference), "-o", str(out), *flags, *overrides, *FT])


def test_energy_run_starts_at_the_reference_keeps_it_and_is_self_contained(reference, tmp_path, capsys):
    """Strategy (ii): f ≡ 0 at step 1, so BCE = softplus(0) + softplus(0) = 2 log 2 exactly; the stored reference
    weights are the reference run's EMA weights bit for bit; with the reference run deleted, `tcsm sample` (SIR)
    and `tcsm eval` still read the run, and every likelihood output names the estimate an estimate."""
    ref_copy = tmp_path / "ref"
    shutil.copytree(reference, ref_copy)
    out = tmp_path / "ii"
    assert _finetune(ref_copy, out, "--loss", "bce", "-n", "2", "--steps", "6", "--eval-examples", "8") == 0
    printed = capsys.readouterr().out
    assert "not a bound" in printed and "reference valid bound" in printed
    first = next(r for r in _rows(out) if r["kind"] == "train" and r["step"] == 1)
    assert first["loss"] == pytest.approx(2 * math.log(2), abs=1e-6) and first["accuracy"] == 0.5
    ref_w = final_weights(reference, "ema")
    for which in ("model", "ema"):
        w = final_weights(out, which)
        assert_same_weights({k[len("reference.") :]: v for k, v in w.items() if k.startswith("reference.")}, ref_w)
    report = json.loads((out / "dre_eval.json").read_text())
    assert {"reference_bpc", "bpc_estimate_n1", "bpc_estimate_n4", "log_z_mean_n4"} <= set(report)
    assert report["bpc_estimate_n1"] != report["bpc_estimate_n4"]
    shutil.rmtree(ref_copy)
    assert main(["sample", str(out), "-n", "3", "--steps", "4", "--sir-k", "3", "--sir-window", "0", "1"]) == 0
    cap = capsys.readouterr()
    assert len(cap.out.splitlines()) == 3 and "sir sampler" in cap.err
    assert main(["eval", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert "not a bound" in result["bound"] and {"bpc_estimate", "bpc_estimate_n1", "reference_bpc"} <= set(result)
    assert main(["sample", str(out), "--top-p", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "sampled by SIR" in err and len(err.strip().splitlines()) == 1


def _as_saved_before_bregman(run_dir: Path) -> None:
    """Rewrite the run's last checkpoint as written when the Bregman generator was `objective.loss`."""
    from tcsm.storage.checkpoint import list_checkpoints
    from tcsm.storage.fileio import file_digest

    step_dir = list_checkpoints(run_dir / "checkpoints")[-1]
    meta = json.loads((step_dir / "state.json").read_text())
    objective = meta["state"]["config"]["objective"]
    objective["loss"] = objective.pop("bregman")
    (step_dir / "state.json").write_text(json.dumps(meta))
    manifest = json.loads((step_dir / "manifest.json").read_text())
    manifest["files"]["state.json"] = {"sha256": file_digest(step_dir / "state.json"),
                                       "bytes": (step_dir / "state.json").stat().st_size}
    (step_dir / "manifest.json").write_text(json.dumps(manifest))


def test_energy_run_resumes_exactly(reference, tmp_path, capsys):
    """Also: `--bregman` and its old name `--loss` train the same run, and a run saved when the key was
    `objective.loss` resumes exactly, without a note (a saved config is read silently)."""
    common = ["lsif", "-n", "3", "--eval-examples", "0", "train.save_every=3"]
    assert _finetune(reference, tmp_path / "full", "--bregman", *common, "--steps", "6") == 0
    assert _finetune(reference, tmp_path / "half", "--loss", *common, "--steps", "3") == 0
    _as_saved_before_bregman(tmp_path / "half")
    capsys.readouterr()
    assert main(["finetune", "dre", "--resume", "-o", str(tmp_path / "half"), "--steps", "6", "--eval-examples", "0"]) == 0
    assert "objective.loss" not in capsys.readouterr().err
    assert_same_weights(final_weights(tmp_path / "half"), final_weights(tmp_path / "full"))
    assert_same_weights(final_weights(tmp_path / "half", "ema"), final_weights(tmp_path / "full", "ema"))


@pytest.mark.parametrize("ref", ["checkpoint", "ema", "previous"])
def test_strategy_i_starts_at_the_reference_and_moves(reference, tmp_path, ref):
    """Strategy (i): the student starts from the reference's weights and every reference choice equals it at step 1,
    so log r ≡ 0 there (accuracy 1/2); the reference checkpoint is untouched and the student moves."""
    before = final_weights(reference, "ema")
    out = tmp_path / "i"
    extra = [] if ref == "checkpoint" else ["--reference", ref]
    argv = ["--strategy", "i", "--loss", "bce", "--steps", "4", "--eval-examples", "4", "optim.lr=3e-3", *extra]
    assert _finetune(reference, out, *argv, "objective.refresh_every=2") == 0
    first = next(r for r in _rows(out) if r["kind"] == "train" and r["step"] == 1)
    assert first["log_r_data"] == 0.0 and first["log_r_ref"] == 0.0 and first["accuracy"] == 0.5
    assert_same_weights(final_weights(reference, "ema"), before)
    after = final_weights(out)
    assert any(not torch.equal(after[k], before[k]) for k in before)
    report = json.loads((out / "dre_eval.json").read_text())
    assert "finetuned_bpc" in report and ("reference_bpc" in report) == (ref == "checkpoint")


def test_previous_iterate_resumes_exactly_or_refuses(reference, tmp_path, capsys):
    """The previous-iterate reference is exact across a resume at a refresh step (4 with N = 2); at step 3 its
    anchor (step 2) was never saved, so resuming there is refused in one line instead of changing the reference."""
    common = ["--strategy", "i", "--reference", "previous", "--eval-examples", "0", "objective.refresh_every=2"]
    assert _finetune(reference, tmp_path / "full", *common, "--steps", "6", "train.save_every=2") == 0
    assert _finetune(reference, tmp_path / "half", *common, "--steps", "4", "train.save_every=2") == 0
    resume = ["finetune", "dre", "--resume", "--steps", "6", "--eval-examples", "0"]
    assert main([*resume, "-o", str(tmp_path / "half")]) == 0
    assert_same_weights(final_weights(tmp_path / "half"), final_weights(tmp_path / "full"))
    assert _finetune(reference, tmp_path / "odd", *common, "--steps", "3", "train.save_every=3") == 0
    capsys.readouterr()
    assert main([*resume, "-o", str(tmp_path / "odd")]) == 2
    err = capsys.readouterr().err
    assert "cannot resume at step 3 exactly" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["path.source=uniform"],
        ["data.vocab_size=6"],
        ["--strategy", "i", "data.vocab_size=6"],
        ["--strategy", "i", "--reference", "DIR/ii"],
    ],
    ids=["source", "vocab", "vocab-strategy-i", "energy-run-as-reference"],
)
def test_mismatched_reference_is_refused_in_one_line(reference, tmp_path, capsys, argv):
    """The ratio p/p^ref needs one vocabulary and one noise source; an energy run is no factorized reference."""
    if "DIR/ii" in argv:
        assert _finetune(reference, tmp_path / "ii", "--steps", "1", "--eval-examples", "0") == 0
        argv = [a.replace("DIR", str(tmp_path)) for a in argv]
    capsys.readouterr()
    assert _finetune(reference, tmp_path / "bad", "--steps", "1", *argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("tcsm finetune: error:") and len(err.strip().splitlines()) == 1
    assert ("same vocabulary and noise source" in err) or ("not a diffusion denoiser" in err)
    assert not (tmp_path / "bad" / "checkpoints").exists()


def test_config_assembly_and_flag_errors(reference, tmp_path, capsys):
    """Strategy (ii) replaces the model by the energy model around the reference; (i) keeps the reference's
    denoiser and warm-starts from it; missing --from and bad -n are one-line errors."""
    assert main(["finetune", "dre", "--from", str(reference), "--print-config"]) == 0
    cfg = capsys.readouterr().out
    assert "name: energy" in cfg and "reference_model:" in cfg and "init_from: null" in cfg
    assert main(["finetune", "dre", "--from", str(reference), "--strategy", "i", "--print-config"]) == 0
    cfg = capsys.readouterr().out
    assert "name: denoiser" in cfg and f"init_from: {reference}" in cfg and "strategy: i" in cfg
    assert main(["finetune", "dre", "-o", str(tmp_path / "x")]) == 2
    assert main(["finetune", "dre", "--from", str(reference), "-n", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("tcsm finetune: error:") for line in err)


def test_the_bregman_generator_is_objective_bregman_under_every_old_name(reference, capsys, monkeypatch):
    """`--bregman`, its old flag `--loss`, the key `objective.bregman` and its old name `objective.loss` (one note)
    set the same config; the old and the new key set to different values are refused in one line."""
    from tcsm.storage import migration

    monkeypatch.setattr(migration, "_noted", set())

    def printed(*argv) -> tuple[str, str]:
        assert main(["finetune", "dre", "--from", str(reference), "--print-config", *argv]) == 0
        cap = capsys.readouterr()
        return cap.out, cap.err

    by_flag = printed("--bregman", "gkl")
    assert "bregman: gkl" in by_flag[0] and "  loss:" not in by_flag[0] and by_flag[1] == ""
    assert printed("--loss", "gkl") == by_flag == printed("objective.bregman=gkl")
    out, err = printed("objective.loss=gkl")
    assert out == by_flag[0]
    assert err == (
        "tcsm: note: objective.loss of objective.name=dre is now objective.bregman "
        "(read as objective.bregman=gkl; in the overrides)\n"
    )
    rc = main(["finetune", "dre", "--from", str(reference), "--print-config", "objective.loss=lsif", "objective.bregman=gkl"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "objective.loss (the old name of objective.bregman for objective.name=dre) and objective.bregman" in err


def test_the_strategy_is_the_resolved_configs(reference, tmp_path, capsys):
    """The strategy the recipe composes for is the one the config resolves to, wherever it is set (the flag, a
    key=value override, a -c file), so `--reference` is accepted or refused by that same value."""
    def printed(*extra) -> str:
        flags = [a for a in extra if "=" not in a or a.startswith("-")]
        assert main(["finetune", "dre", "--from", str(reference), *flags, "--print-config",
                     *[a for a in extra if a not in flags]]) == 0  # fmt: skip
        return capsys.readouterr().out

    by_flag = printed("--strategy", "i")
    assert printed("objective.strategy=i") == by_flag
    preset = tmp_path / "strategy-i.yaml"  # the finetune-dre preset with strategy i
    preset.write_text((Path(tcsm.__file__).parent / "configs" / "finetune-dre.yaml").read_text().replace(
        "strategy: ii", "strategy: i"))  # fmt: skip
    assert printed("-c", str(preset)) == by_flag
    assert "reference: ema" in printed("objective.strategy=i", "--reference", "ema", "train.ema=0.9")
    assert main(["finetune", "dre", "--from", str(reference), "--reference", "ema", "--print-config"]) == 2
    assert "--reference belongs to strategy i" in capsys.readouterr().err
    assert "name: energy" in printed("--strategy", "ii", "objective.strategy=i")  # a flag is set last


def test_eval_of_an_energy_run_says_its_cost_shows_progress_and_defaults_to_the_runs_eval_size(
    reference, tmp_path, capsys, monkeypatch
):
    """Issue 21 item 3: `tcsm eval` on an energy run printed nothing for 15 minutes (the whole split, ~270 times a
    pre-trained bound's calls). Now it evaluates the run's train.eval_examples sequences unless told otherwise,
    says what that costs before it starts, reports progress with an ETA, and --help says how to raise the cost."""
    from tcsm.core.progress import WorkProgress

    out = tmp_path / "ii"
    assert _finetune(reference, out, "-n", "2", "--steps", "1", "--eval-examples", "0") == 0
    capsys.readouterr()
    monkeypatch.setattr(WorkProgress, "EVERY_S", 0.0)  # a line at every chunk of energy rows
    assert main(["eval", str(out), "--json", "objective.eval_max_rows=64"]) == 0
    cap = capsys.readouterr()
    result = json.loads(cap.out)
    assert result["num_sequences"] == 8 and result["log_z_samples"] == 4  # the run's train.eval_examples, n
    progress = [line for line in cap.err.splitlines() if line.startswith("energy-model estimate ")]
    assert len(progress) > 2 and all("ETA" in line and "energy rows" in line for line in progress)
    assert main(["eval", str(out), "--max-examples", "12", "--log-z-samples", "2", "--num-t", "1"]) == 0
    cap = capsys.readouterr()
    assert "first 12 of 32 valid sequences x 1 times x n=2" in cap.err and "energy calls" in cap.err
    assert "n=2 draws" in cap.out and "12 sequences" in cap.out
    assert main(["eval", str(out), "--log-z-samples", "0,4"]) == 2
    assert "--log-z-samples" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    assert "--log-z-samples" in (help_text := " ".join(capsys.readouterr().out.split())) and "energy calls" in help_text
    assert "--max-examples" in help_text.split("Cost:")[1]


def test_the_estimates_cost_is_what_it_calls_and_progress_counts_it():
    """energy_estimate_cost is the expected number of energy rows, and the ticks add up to the rows computed."""
    from tcsm.paths import MaskedPath
    from tcsm.posttrain.dre.likelihood import energy_estimate_cost, energy_nelbo_terms

    V, L, B, num_t, n = 4, 6, 64, 8, 3
    path = MaskedPath(V)
    calls = []

    def energy(x1, xt, t):
        calls.append(x1.shape[0])
        return torch.zeros(x1.shape[0])

    def reference(xt, t):
        return torch.zeros(*xt.shape, V)

    ticks = []
    g = torch.Generator().manual_seed(0)
    x1 = torch.randint(0, V, (B, L), generator=g)
    energy_nelbo_terms(reference, energy, x1, path, num_t=num_t, num_samples=[1, n], generator=g, max_rows=50,
                       tick=ticks.append)
    assert ticks == calls and max(calls) <= 50
    expected = energy_estimate_cost(path, B, L, num_t, n)
    assert expected == pytest.approx(B * num_t * n * (1 + L / 2))  # linear schedule: half the tokens masked
    assert sum(calls) == pytest.approx(expected, rel=0.1)
