"""Post-training methods, one folder each, every folder holding all of its method: the losses and objective
(math, MATH.md §5), its samplers or targets, its models, its config schema and registry entries (`builder`), and its
run config and report (`recipe`). The command lives in `tcsm.cli` (one module per command).

    dre/         density-ratio fine-tuning (§5.1): Bregman losses, strategies (i)/(ii), energy model, SIR
    preference/  preference fine-tuning (§5.3): pairs data, the paper's BCE and a DPO-style loss
    reward/      reward fine-tuning (§5.2): N^1 / N^full reward-tilted targets, reward functions
    distill/     AR → diffusion distillation (§5.4): teacher target and its estimators, n-gram right context

A new method gets a folder of its own with the same parts; nothing in the trainer changes (docs/DESIGN.md)."""
