"""gen-PPL and sample entropy of a masked teacher's left-to-right K_s-step law (MATH.md §10.1, "The teacher's
left-to-right fill"): K_s steps of the ancestral sampler's reveal sets, each filled by the teacher one token a call
in position order (`posttrain.fewstep.joint.fill_left_to_right`) — the law a joint student distilled with
`target.fill=left_to_right` learns — beside the teacher's own K-step sampler, seeds and configurations interleaved.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/fewstep_fill_law.py --teacher runs/teacher \\
        --judge runs/judge --fill-steps 4,8 --teacher-steps 64 --seeds 0,1,2 --num 256 --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def _args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--teacher", required=True, help="the teacher run (masked source, full-sequence)")
    ap.add_argument("--judge", required=True, help="causal LM run or HF directory that scores the samples")
    ap.add_argument("--fill-steps", default="4,8", help="K_s of the left-to-right laws")
    ap.add_argument("--teacher-steps", default="64", help="K of the teacher's own sampler")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--num", type=int, default=256, help="sequences a draw")
    ap.add_argument("--out", default=None)
    return ap.parse_args(argv)


def fill_law_draw(model, path, num: int, length: int, steps: int, generator):
    """[num, length] drawn from the teacher's left-to-right `steps`-step law, and its teacher calls per row."""
    import torch

    from tcsm.posttrain.fewstep.joint import fill_left_to_right

    x = torch.full((num, length), path.mask_id, dtype=torch.long)
    calls = torch.zeros(num, dtype=torch.long)
    for j in range(steps):
        t = torch.full((num,), j / steps, dtype=torch.float64)
        s = torch.full((num,), (j + 1) / steps, dtype=torch.float64)
        lam = path.jump_prob(t, s)[:, None]
        reveal = (x == path.mask_id) & (torch.rand(x.shape, dtype=torch.float64, generator=generator) < lam)
        x, _, c = fill_left_to_right(model, x, t, s, reveal, path.vocab_size, generator=generator)
        calls += c
    return x, calls


def main(argv=None) -> dict:
    args = _args(argv)
    import torch

    torch.set_num_threads(1)
    from tcsm.builders.loading import load_checkpoint, load_scorer_lm
    from tcsm.evaluation import generative_perplexity, sample_entropy
    from tcsm.sampling.settings import draw, sample_settings

    device = torch.device("cpu")
    ck = load_checkpoint(args.teacher, device=device)
    judge = load_scorer_lm(args.judge, device)
    path, L, model = ck.build_path(), int(ck.data_info["seq_len"]), ck.model.eval()
    configs = [("left_to_right", int(k)) for k in args.fill_steps.split(",")]
    configs += [("teacher", int(k)) for k in args.teacher_steps.split(",")]
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for kind, K in configs:
            g = torch.Generator().manual_seed(seed)
            c0 = time.process_time()
            with torch.no_grad():
                if kind == "teacher":
                    x, st = draw(model, path, args.num, L, sample_settings(ck.config.sample, steps=K), generator=g)
                    calls = float(st.num_calls)
                else:
                    x, c = fill_law_draw(model, path, args.num, L, K, g)
                    calls = float(c.double().mean())
            cpu = time.process_time() - c0
            row = {"law": kind, "steps": K, "seed": seed, "gen_ppl": generative_perplexity(judge, token_ids=x,
                   batch_size=32).gen_ppl, "entropy": sample_entropy(x)["entropy_mean"], "calls_per_row": calls,
                   "sample_cpu_s": cpu, "loadavg": os.getloadavg()}  # fmt: skip
            print(json.dumps(row), flush=True)
            rows.append(row)
    table = []
    for kind, K in configs:
        rs = [r for r in rows if r["law"] == kind and r["steps"] == K]
        p = [r["gen_ppl"] for r in rs]
        table.append({"law": kind, "steps": K, "gen_ppl_mean": statistics.mean(p),
                      "gen_ppl_sd": statistics.stdev(p) if len(p) > 1 else 0.0,
                      "entropy_mean": statistics.mean(r["entropy"] for r in rs)})  # fmt: skip
        print(f"{kind:>14} {K:3d} steps: gen-PPL {table[-1]['gen_ppl_mean']:.1f} ± {table[-1]['gen_ppl_sd']:.1f}, "
              f"entropy {table[-1]['entropy_mean']:.4f}")
    result = {"teacher": args.teacher, "judge": args.judge, "num": args.num, "rows": rows, "table": table}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
