"""`tcsm quickstart`: train a small model on the embedded synthetic Markov source, evaluate its likelihood
bound on held-out data, sample from it, and compare with the source's exact entropy — a few minutes on a
laptop CPU, and a check that the whole stack works on this machine.

Every figure is in bits per token; the final ones are written to `quickstart.json` in the run directory and
under "test" in its `summary.json` (whose other entries are the last validation, on the valid split)."""

from __future__ import annotations

import argparse

HELP = "train, evaluate and sample a small model on the embedded synthetic source (a few minutes on CPU)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "overrides", nargs="*", metavar="key=value", help="config overrides of the synthetic preset"
    )
    p.add_argument("-o", "--out", help="run directory (default: runs/quickstart-<time>)")
    p.add_argument("--config", default="synthetic", help="preset or YAML file (default: synthetic)")
    from tcsm.cli.common import add_overwrite_argument

    add_overwrite_argument(p)


def run(args) -> int:
    import json
    import math
    import time
    from pathlib import Path

    import torch

    from tcsm.builders.config import load_config
    from tcsm.builders.loading import load_checkpoint
    from tcsm.cli.common import claim_run_dir, default_run_dir, format_bound, jsonable
    from tcsm.cli.train import train
    from tcsm.evaluation.likelihood import evaluate_bound
    from tcsm.sampling.settings import draw, sample_settings
    from tcsm.storage.fileio import write_atomically

    start = time.perf_counter()
    cfg = load_config(args.config, args.overrides)
    run_dir = Path(args.out) if args.out else default_run_dir("quickstart")
    claim_run_dir(run_dir, resume=False, overwrite=args.overwrite)
    print(
        f"tcsm quickstart: training {cfg.train.steps} steps on the synthetic Markov source → {run_dir}",
        flush=True,
    )
    train(cfg, run_dir, overwrite=args.overwrite)

    ckpt = load_checkpoint(run_dir, device="cpu")
    data = ckpt.build_data()
    path = ckpt.build_path()
    e = cfg.eval
    test = data.test[: e.max_examples] if e.max_examples else data.test
    result = evaluate_bound(
        ckpt.model,
        test,
        path,
        batch_size=e.batch_size,
        num_t=e.num_t,
        generator=torch.Generator().manual_seed(e.seed),
        bound=e.bound,
    )
    floor_bits = data.nats_per_token_floor / math.log(2)
    result["floor_bpc"] = floor_bits
    # The source's exact NLL of these very sequences: the floor up to the sampling noise of the test set.
    test_nll = -data.source.log_prob(test).mean().item() / data.seq_len / math.log(2) if data.source else None
    samples_nll = None
    texts, tokens = [], None
    if cfg.sample.num:
        tokens, _ = draw(
            ckpt.model,
            path,
            max(cfg.sample.num, 64),
            data.seq_len,
            sample_settings(cfg.sample),
            generator=torch.Generator().manual_seed(cfg.sample.seed),
        )
        texts = [data.decode(row) for row in tokens[: cfg.sample.num]]
        if data.source is not None:
            # The exact log-likelihood of the model's samples under the true source: close to the entropy when the
            # samples look like the data (much higher if the sampler produced junk).
            samples_nll = -data.source.log_prob(tokens).mean().item() / data.seq_len / math.log(2)
    final = {
        "unit": "bits/token",
        "step": ckpt.step,
        "weights": ckpt.weights,
        "split": "test",
        "data": data.label,
        "source_entropy": floor_bits,
        "test": jsonable(result),
        "source_nll_on_test": test_nll,
        "samples_nll": samples_nll,
        "num_samples": None if tokens is None else int(tokens.shape[0]),
    }
    write_atomically(run_dir / "quickstart.json", json.dumps(final, indent=1) + "\n")
    summary_file = run_dir / "summary.json"
    summary = json.loads(summary_file.read_text(encoding="utf-8")) if summary_file.is_file() else {}
    write_atomically(summary_file, json.dumps({**summary, "test": final["test"]}, indent=1) + "\n")
    minutes, seconds = divmod(time.perf_counter() - start, 60)
    print(f"\n== quickstart done in {int(minutes)}m{seconds:04.1f}s: {run_dir}")
    print(f"  data            {data.label}")
    print(f"  source entropy  {floor_bits:.4f} bits/token   (the floor: no model can do better on average)")
    print(f"  test bound      {format_bound(result)}")
    if test_nll is not None:
        gap = 100 * (result["bpc"] / test_nll - 1)
        print(f"  source NLL      {test_nll:.4f} bits/token on the same test sequences (model bound {gap:+.1f}%)")
    if samples_nll is not None:
        print(f"  samples' NLL    {samples_nll:.4f} bits/token under the true source ({tokens.shape[0]} samples)")
    for t in texts:
        print(f"    | {t}")
    print(f"  written to      {run_dir / 'quickstart.json'}")
    print(
        f"next: tcsm eval {run_dir} --split test   ·   tcsm train --help   ·   TensorBoard: {run_dir}/tensorboard"
    )
    return 0
