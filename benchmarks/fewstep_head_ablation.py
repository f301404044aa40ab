"""What a joint few-step student's step head contributes (MATH.md §10.1, docs/benchmarks.md "Few-step distillation:
joint rounds on the synthetic Markov source"): each joint round's student sampled as trained and with its step
head's output projection zeroed (its denoiser's factorised step, the head's state at initialisation), beside the
original teacher, at several step counts and sampling seeds, interleaved within each (seed, steps); gen-PPL under a
separate causal judge and sample entropy, as benchmarks/fewstep.py measures them.

    OMP_NUM_THREADS=1 python benchmarks/fewstep_head_ablation.py --teacher runs/syn/teacher --judge runs/syn/judge \
        --rounds runs/syn/joint/round1,runs/syn/joint/round3 --eval-steps 4,8,64 --seeds 0,1,2 --num-samples 256 \
        --out benchmarks/results/fewstep_synthetic_head_ablation.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
from pathlib import Path

import torch


def _args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--teacher", required=True, help="the original teacher run")
    ap.add_argument("--judge", required=True, help="causal LM run scoring the samples (gen-PPL)")
    ap.add_argument("--rounds", required=True, help="comma-separated joint-student run directories")
    ap.add_argument("--eval-steps", default="4,8,64")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--num-samples", type=int, default=256)
    ap.add_argument("--out", default=None)
    return ap.parse_args(argv)


def _fewstep():
    spec = importlib.util.spec_from_file_location("fewstep_bench", Path(__file__).with_name("fewstep.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv=None) -> None:
    args = _args(argv)
    torch.set_num_threads(1)
    from tcsm.builders.loading import load_checkpoint, load_scorer_lm

    bench, device = _fewstep(), torch.device("cpu")
    models = {"teacher": load_checkpoint(args.teacher, device=device)}
    for d in args.rounds.split(","):
        name = Path(d).name
        models[name] = load_checkpoint(d, device=device)
        ablated = load_checkpoint(d, device=device)
        head = getattr(ablated.model, "step_head", None)
        if head is None:
            raise SystemExit(f"{d} is not a joint student (its model has no step head)")
        # the head's output corrects the denoiser's logits: zeroed, the step is the factorised one
        with torch.no_grad():
            for p in head.out.parameters():
                p.zero_()
        models[f"{name} head zeroed"] = ablated
    judge = load_scorer_lm(args.judge, device)
    steps = [int(k) for k in args.eval_steps.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = bench.evaluate(models, judge, steps, seeds, args)
    result = {"teacher": args.teacher, "rounds": args.rounds.split(","), "judge": judge.name, "seeds": seeds,
              "num_samples": args.num_samples, "summary": bench.summary(rows), "rows": rows,
              "load_average": os.getloadavg(), "args": vars(args)}  # fmt: skip
    for row in result["summary"]:
        bench._log(f"{row['model']:>20} K={row['steps']:3d}: gen-PPL {row['gen_ppl_mean']:8.3f} ± "
                   f"{row['gen_ppl_sd']:.3f}  entropy {row['entropy_mean']:.4f} ± {row['entropy_sd']:.4f}")  # fmt: skip
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
