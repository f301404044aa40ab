"""Expected cost of each shipped preset: seconds per training step, per periodic validation and per logged-sample
call, measured through the real Trainer, and the whole run they add up to (train.steps steps plus the periodic
evaluations and samples the preset schedules). These are the figures the presets' "expected cost" lines and the
README quote.

Every round visits every preset once (interleaved), so a shared machine's load drifts hit all presets alike; the
reported value is the median over rounds. torch runs one thread (`--threads`), CPU time (time.process_time) is
recorded beside wall time, and the 1-minute load average before and after each measurement.

Presets that need another run get one trained for a single step first (the cost of a step does not depend on how
well that run is trained): `parametric-student[hollow]` / `parametric-student[mlm]` use a hollow / mlm
teacher, `finetune-grid` a demo-grid pre-trained model (its x_t pool is drawn in the warm-up step and redrawn every
refresh_every steps, which the per-step figure leaves out). text8-paper is measured with the text8-prefix file in
place of the full text8 (same L = 256, so the same step cost) and only on a GPU (`--device cuda`).

    .venv/bin/python benchmarks/preset_cost.py --out benchmarks/results/preset_cost.json
    .venv/bin/python benchmarks/preset_cost.py --presets synthetic --steps 2 --rounds 1   # tiny setting
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

CPU_PRESETS = ("synthetic", "demo-grid", "text8-prefix-small", "mlm", "causal-lm", "hollow")
TEXT8_PREFIX = "../shared/data/text8/text8_prefix.txt.gz"


def _timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of fn()."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - w0, time.process_time() - c0


def _common(device: str, threads: int) -> list[str]:
    return [f"train.device={device}", f"train.threads={threads}", "train.progress=false", "train.tensorboard=false"]


def prerequisite(preset: str, work: Path, device: str, threads: int) -> Path:
    """A one-step run of `preset` in `work` (reused when it is there)."""
    from tcsm.builders.config import load_config
    from tcsm.train.trainer import Trainer

    run = work / preset
    if not (run / "checkpoints").is_dir():
        overrides = _common(device, threads) + ["train.steps=1", "train.eval_every=0", "train.sample_every=0"]
        Trainer.from_config(load_config(preset, overrides), run, log=lambda s: None).fit()
    return run


def build(name: str, device: str, threads: int, work: Path):
    from tcsm.builders.config import load_config
    from tcsm.train.trainer import Trainer

    overrides = _common(device, threads)
    preset = name.split("[")[0]
    if name.startswith("parametric-student["):
        teacher = prerequisite(name.split("[")[1].rstrip("]"), work, device, threads)
        cfg = load_config(preset, overrides + [f"target.teacher={teacher}"])
    elif preset == "finetune-grid":
        from tcsm.recipes.reward.compose import reward_config

        cfg = reward_config(prerequisite("demo-grid", work, device, threads), preset, overrides)
    else:
        if preset == "text8-paper":  # the full text8 is not on this machine; the prefix has the same L
            overrides += ["data.split=prefix", f"data.path={TEXT8_PREFIX}"]
        cfg = load_config(preset, overrides)
    return Trainer.from_config(cfg, None, log=lambda s: None)


def measure(trainer, steps: int, fast_steps: int) -> dict:
    """One visit: wall/CPU seconds per step (after one warm-up step; `fast_steps` steps when a step takes under
    0.5 s, so that fast presets are timed over more than timer noise), per validation and per sample call."""
    warm, _ = _timed(trainer.train_step)  # also warms allocations and autocast caches
    steps = steps if warm > 0.5 else fast_steps
    load0 = os.getloadavg()[0]
    wall, cpu = _timed(lambda: [trainer.train_step() for _ in range(steps)])
    t = trainer.cfg.train
    ev_wall, ev_cpu = _timed(lambda: trainer.validate(max_examples=t.eval_examples))
    smp_wall, smp_cpu = _timed(trainer.samples)
    return {
        "timed_steps": steps,
        "step_s": wall / steps,
        "step_cpu_s": cpu / steps,
        "eval_s": ev_wall,
        "eval_cpu_s": ev_cpu,
        "sample_s": smp_wall,
        "sample_cpu_s": smp_cpu,
        "load_before": load0,
        "load_after": os.getloadavg()[0],
    }


def run_cost(cfg, m: dict) -> float:
    """train.steps steps + the periodic validations and sample calls the preset schedules (0 = only at the end)."""
    t = cfg.train
    evals = t.steps // t.eval_every if t.eval_every else 1
    samples = (t.steps // t.sample_every if t.sample_every else 1) if cfg.sample.num else 0
    return t.steps * m["step_s"] + evals * m["eval_s"] + samples * m["sample_s"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default=",".join(CPU_PRESETS), help="comma-separated preset names")
    p.add_argument("--steps", type=int, default=3, help="timed training steps per visit (after one warm-up step)")
    p.add_argument("--fast-steps", type=int, default=50, help="timed steps of presets whose step is under 0.5 s")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median over them)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--device", default="cpu", help="cpu | cuda")
    p.add_argument("--out", help="JSON results file")
    p.add_argument("--work-dir", default="runs/bench/preset_cost", help="where prerequisite runs (teachers, ...) go")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    presets = [s for s in args.presets.split(",") if s]
    visits: dict[str, list[dict]] = {name: [] for name in presets}
    cfgs = {}
    start = time.perf_counter()
    for r in range(args.rounds):
        for name in presets:
            trainer = build(name, args.device, args.threads, Path(args.work_dir))
            cfgs[name] = trainer.cfg
            visits[name].append(measure(trainer, args.steps, args.fast_steps))
            del trainer
            v = visits[name][-1]
            print(f"round {r} {name}: {v['step_s']:.3f} s/step, eval {v['eval_s']:.1f} s, sample {v['sample_s']:.1f} s, "
                  f"load {v['load_before']:.1f}", flush=True)
    results = {}
    for name, vs in visits.items():
        med = {k: statistics.median(v[k] for v in vs) for k in vs[0]}
        cfg = cfgs[name]
        results[name] = {
            **med,
            "train_steps": int(cfg.train.steps),
            "eval_every": int(cfg.train.eval_every),
            "sample_every": int(cfg.train.sample_every),
            "run_s": run_cost(cfg, med),
            "visits": vs,
        }
        print(f"{name}: {med['step_s']:.3f} s/step (CPU {med['step_cpu_s']:.3f}), {cfg.train.steps} steps "
              f"-> about {results[name]['run_s'] / 3600:.2f} h")
    meta = {
        "command": "benchmarks/preset_cost.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "device": args.device,
        "threads": args.threads,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
        "wall_s": time.perf_counter() - start,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"meta": meta, "presets": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
