"""A few-step round's update against the teacher's own pre-training step, at one load: the two take turns in
rounds in this process (each after an untimed warm-up step), and each round reports the CPU-s of an update, of a
pre-training step at the teacher run's own batch size, and their ratio. A round of U updates then costs
U × ratio / S of a pre-training of S steps, a figure that does not depend on the machine's load the way two CPU
times measured at different times do (docs/benchmarks.md, "Few-step distillation: ...").

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/fewstep_cost_ratio.py --teacher runs/teacher \\
        --set target.form=joint --set target.fill=left_to_right --set target.student_steps=8 \\
        --updates 40 --pretrain-steps 40 --rounds 3 --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from fewstep import StepClock  # this script's folder is on sys.path


def _args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--teacher", required=True, help="the teacher run")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an override of the round's config (repeatable)")
    ap.add_argument("--batch-size", type=int, default=16, help="the round's batch")
    ap.add_argument("--updates", type=int, default=40, help="timed round updates a turn")
    ap.add_argument("--pretrain-steps", type=int, default=40, help="timed pre-training steps a turn")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    return ap.parse_args(argv)


QUIET = ["train.threads=1", "train.device=cpu", "train.progress=false", "train.tensorboard=false",
         "train.save_every=0", "train.eval_every=0", "train.sample_every=0", "sample.num=0", "train.log_every=1000",
         "train.precision=fp32"]  # fmt: skip


def timed(cfg, work: Path) -> float:
    """CPU-s per step of the run `cfg` after its first step."""
    from tcsm.train.trainer import Trainer

    clock = StepClock()
    Trainer.from_config(cfg, work, log=lambda m: None, overwrite=True, callbacks=[clock]).fit()
    return clock.per_step()


def main(argv=None) -> dict:
    args = _args(argv)
    import torch

    torch.set_num_threads(1)
    from tcsm.builders.config import load_config
    from tcsm.builders.source import source_run
    from tcsm.recipes.fewstep.compose import fewstep_config

    _, base = source_run(args.teacher, "fewstep")
    pretrain_batch = int(base["train"]["batch_size"])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            round_cfg = fewstep_config(args.teacher, overrides=[*QUIET, f"train.steps={1 + args.updates}",
                                                                f"train.batch_size={args.batch_size}", *args.set])  # fmt: skip
            pre_cfg = load_config(None, [*QUIET, f"train.steps={1 + args.pretrain_steps}", "train.out_dir=null"],
                                  base=base)  # fmt: skip
            load = os.getloadavg()
            update = timed(round_cfg, Path(tmp) / f"round{r}")
            step = timed(pre_cfg, Path(tmp) / f"pre{r}")
            rows.append({"round": r, "update_cpu_s": update, "pretrain_step_cpu_s": step, "ratio": update / step,
                         "loadavg_start": load, "loadavg_end": os.getloadavg()})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    result = {"teacher": args.teacher, "set": args.set, "batch_size": args.batch_size,
              "pretrain_batch_size": pretrain_batch, "pretrain_steps_total": int(base["train"]["steps"]),
              "rows": rows, "ratio_median": statistics.median(r["ratio"] for r in rows)}  # fmt: skip
    ratios = ", ".join(f"{r['ratio']:.2f}" for r in rows)
    print(f"update / pre-training step: {ratios} (median "
          f"{result['ratio_median']:.2f}); the teacher pre-trained {result['pretrain_steps_total']} steps of batch "
          f"{pretrain_batch}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
