"""Density-ratio post-training, the math (MATH.md §5.1, §6.3): `losses` (Bregman DRE losses, strategy (i) and (ii)
log-ratios, reference negatives, log Ẑ), `objective` (the training objectives), `references` (EMA / previous-iterate
references), `ratio_head` and `energy` (the strategy-(ii) model), `likelihood` (the energy model's labelled IS
estimate), `sir` (its sampler). Its recipe (`tcsm finetune dre`) is `tcsm.recipes.dre`."""
