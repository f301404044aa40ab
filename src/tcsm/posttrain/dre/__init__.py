"""Density-ratio post-training (MATH.md §5.1): `losses` (Bregman DRE losses, strategy (i) and (ii) log-ratios,
reference negatives, log Ẑ), `objective` (the training objectives), `references` (EMA / previous-iterate
references), `ratio_head` and `energy` (the strategy-(ii) model), `likelihood` (the energy model's labelled IS
estimate), `sir` (its sampler, §6.3), `builder` (config schemas and registry entries), `recipe` (run config and
report). Command: `tcsm finetune dre` (tcsm.cli.finetune_dre)."""
