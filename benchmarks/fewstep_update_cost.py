"""CPU time of a few-step round's update and of the teacher rollout inside it (docs/benchmarks.md, "Few-step
distillation: ..."), for comparing two source trees side by side: run it once per tree in alternating rounds, with
PYTHONPATH naming the tree, and compare the per-update medians.

    for r in 1 2 3; do for tree in /path/old /path/new; do OMP_NUM_THREADS=1 PYTHONPATH=$tree/src \\
        python benchmarks/fewstep_update_cost.py --teacher runs/teacher --teacher-steps 64 --student-steps 8 \\
        --form joint --updates 20 --label $(basename $tree) --out results.jsonl; done; done
"""

from __future__ import annotations

import argparse
import json
import os
import time


def _args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--teacher", required=True, help="the teacher run")
    ap.add_argument("--teacher-steps", type=int, default=64)
    ap.add_argument("--student-steps", type=int, default=8)
    ap.add_argument("--form", default="joint", choices=("conditionals", "draws", "joint"))
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--updates", type=int, default=20, help="timed updates, after one untimed warm-up update")
    ap.add_argument("--reuse", type=int, default=1, help="target.reuse: updates each rollout serves on average")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a further override of the round's config (repeatable), e.g. target.fill=left_to_right")
    ap.add_argument("--label", default="", help="a name for this tree in the output")
    ap.add_argument("--out", default=None, help="JSON lines file to append the result to")
    return ap.parse_args(argv)


def main(argv=None) -> dict:
    args = _args(argv)
    import torch

    torch.set_num_threads(1)
    import tcsm
    from tcsm.posttrain.fewstep.target import TeacherRounds
    from tcsm.recipes.fewstep.compose import fewstep_config
    from tcsm.train.trainer import Trainer

    overrides = [f"target.teacher_steps={args.teacher_steps}", f"target.student_steps={args.student_steps}",
                 f"target.form={args.form}", f"train.steps={1 + args.updates}", f"train.batch_size={args.batch_size}",
                 "train.precision=fp32", "train.threads=1", "train.device=cpu", "sample.num=0", "train.save_every=0",
                 "train.eval_every=0", "train.progress=false", "train.tensorboard=false",
                 f"target.reuse={args.reuse}", *args.set]  # fmt: skip
    trainer = Trainer.from_config(fewstep_config(args.teacher, overrides=overrides), None, log=lambda *a: None)
    target = type(trainer.objective.target)  # a pooled target (target.reuse) is timed whole, its pool included
    if not isinstance(getattr(trainer.objective.target, "target", trainer.objective.target), TeacherRounds):
        raise SystemExit(f"the run's target is {target.__name__}, not a few-step target")
    call, marks, rollout = target.__call__, [], [0.0]

    def timed(self, *a, **k):  # the whole target call: x_t, the teacher's rollout, the batch it hands over
        c = time.process_time()
        out = call(self, *a, **k)
        rollout[0] += time.process_time() - c
        marks.append((time.process_time(), rollout[0]))
        return out

    target.__call__ = timed
    load = os.getloadavg()
    trainer.fit()
    target.__call__ = call
    # from the end of the first (warm-up) target call to the end of the last: `updates` whole updates minus the
    # last one's loss and step, plus the first one's; the rollout share counts the timed calls only
    (c0, r0), (c1, r1) = marks[0], marks[-1]
    n = len(marks) - 1
    result = {"label": args.label, "tree": os.path.dirname(os.path.dirname(tcsm.__file__)), "updates": n,
              "cpu_s_per_update": (c1 - c0) / n, "target_cpu_s_per_update": (r1 - r0) / n,
              "teacher_steps": args.teacher_steps, "student_steps": args.student_steps, "form": args.form, "reuse": args.reuse,
              "batch_size": args.batch_size, "set": args.set, "loadavg_start": load, "loadavg_end": os.getloadavg()}  # fmt: skip
    print(json.dumps(result))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(result) + "\n")
    return result


if __name__ == "__main__":
    main()
