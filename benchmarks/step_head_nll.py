"""What a joint student's step head has learnt (MATH.md §10.1), on held-out teacher rollouts: the negative
log-likelihood of the tokens one student step reveals, from x_t at the student's grid point t_j through the teacher's
r = K/K_s steps to t_{j+1} (`StepTarget.reach`, the round's own target), under

- `factorised`: the student's denoiser alone (its head zeroed: the factorised step);
- `joint`: the denoiser plus the step head, teacher-forced over the reveal set left to right (the round's loss);
- `teacher substep`: the teacher's own conditional at the teacher step that drew each token. It knows which of the
  r steps drew what, which the student does not, so it is a reference, not a bound.

Reported over all revealed tokens and over those whose left neighbour was revealed in the same student step (where a
head reading its predecessor has the most to gain). Rows are the valid split, x_t drawn at uniform grid points; one
thread, fp32.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/step_head_nll.py --teacher runs/syn/teacher \
        --student runs/fs/round1 --teacher-steps 64 --student-steps 8
"""

from __future__ import annotations

import argparse
import json


def _args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--teacher", required=True, help="the teacher run (the round's reference)")
    ap.add_argument("--student", required=True, help="the joint student run (a denoiser with a step head)")
    ap.add_argument("--teacher-steps", type=int, required=True, help="K: the teacher's grid")
    ap.add_argument("--student-steps", type=int, required=True, help="K_s: the student's grid, a divisor of K")
    ap.add_argument("--batches", type=int, default=7, help="batches of held-out rows")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--seed", type=int, default=123)
    ap.add_argument("--out", default=None, help="JSON file for the result")
    return ap.parse_args(argv)


def rollout(target, path, x1, g):
    """(x_t, t_j, reveal set R, tokens at R, the teacher's log conditional each was drawn from) for clean rows x1:
    the round's own target (`StepTarget.reach`) from x_t at uniform grid points t_j."""
    import torch

    B, Ks = x1.shape[0], target.student_steps
    j = torch.randint(0, Ks, (B,), generator=g)
    ts = j.to(torch.get_default_dtype()) / Ks
    xt = path.draw_xt(x1, ts, g)
    xs, _, log_cond = target.reach(path, xt, j, path.free(xt), g, conditionals=True)
    reveal = (xt == path.mask_id) & (xs != xt)
    return xt, ts, reveal, torch.where(reveal, xs, 0), log_cond


def main(argv=None) -> None:
    args = _args(argv)
    import torch

    from tcsm.builders.loading import load_checkpoint
    from tcsm.posttrain.fewstep.joint import StepTarget

    torch.set_num_threads(1)
    K, Ks = args.teacher_steps, args.student_steps
    if Ks < 1 or K % Ks:
        raise SystemExit(f"--student-steps ({Ks}) must divide --teacher-steps ({K})")
    teacher_run, student_run = load_checkpoint(args.teacher, device="cpu"), load_checkpoint(args.student, device="cpu")
    teacher, student = teacher_run.model.eval(), student_run.model.eval()
    if not hasattr(student, "step_head"):
        raise SystemExit(f"{args.student} has no step head: give a joint student (--form joint)")
    path, data = teacher_run.build_path(), teacher_run.build_data()
    rows = data.valid.long()
    need = args.batches * args.batch_size
    if rows.shape[0] < need:
        raise SystemExit(f"the valid split has {rows.shape[0]} rows, fewer than --batches x --batch-size = {need}")
    target = StepTarget(teacher, K, Ks)
    g = torch.Generator().manual_seed(args.seed)
    sums = {key: {"factorised": 0.0, "joint": 0.0, "teacher substep": 0.0, "tokens": 0} for key in ("all", "neighbour")}
    with torch.no_grad():
        for b in range(args.batches):
            xt, ts, reveal, tokens, log_cond = rollout(target, path, rows[b * args.batch_size:(b + 1) * args.batch_size],
                                                       g)  # fmt: skip
            at = tokens[..., None]
            nll = {"factorised": -student(xt, ts).log_softmax(-1).gather(-1, at)[..., 0],
                   "joint": -student(xt, ts, reveal=reveal, tokens=tokens).log_softmax(-1).gather(-1, at)[..., 0],
                   "teacher substep": -log_cond.gather(-1, at)[..., 0].float()}  # fmt: skip
            left = torch.zeros_like(reveal)
            left[:, 1:] = reveal[:, :-1]
            for key, where in (("all", reveal), ("neighbour", reveal & left)):
                for name, v in nll.items():
                    sums[key][name] += float(v[where].sum())
                sums[key]["tokens"] += int(where.sum())
    result = {"teacher": args.teacher, "student": args.student, "teacher_steps": K, "student_steps": Ks,
              "nll": {key: {name: (v / max(s["tokens"], 1) if name != "tokens" else v) for name, v in s.items()}
                      for key, s in sums.items()}}  # fmt: skip
    for key, s in result["nll"].items():
        print(f"{key:>9} ({s['tokens']} tokens): factorised {s['factorised']:.4f}  joint {s['joint']:.4f}  "
              f"teacher substep {s['teacher substep']:.4f} nats")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
