"""Preference fine-tuning, the math (MATH.md §5.3): `objective` (sequence log-ratios against the frozen reference,
the paper's BCE and a DPO-style loss). Its data kind is `tcsm.data.pairs`; its recipe (`tcsm pairs`, `tcsm finetune
preference`) is `tcsm.recipes.preference`."""
