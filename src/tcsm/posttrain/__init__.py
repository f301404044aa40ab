"""Post-training methods, the math only (MATH.md §5): one folder per method with its losses, objectives, targets,
samplers or models — tensors and model objects in, nothing read from disk or a config. Each method's recipe (schema,
registry entries, run config, report, command) is `tcsm.recipes.<method>`.

    dre/         density-ratio fine-tuning (§5.1): Bregman losses, strategies (i)/(ii), energy model, SIR
    preference/  preference fine-tuning (§5.3): the paper's BCE and a DPO-style loss against the reference
    reward/      reward fine-tuning (§5.2): N^1 / N^full reward-tilted targets, reward functions
    distill/     AR → diffusion distillation (§5.4): teacher target and its estimators, n-gram right context
    sft/         instruction fine-tuning: the composed objective on prompt-pinned records, completion | prompt bound
"""
