"""Reward fine-tuning, the math (MATH.md §5.2): `targets` (N^1 tilted conditionals, N^full self-normalised
importance weights), `rewards` (reward functions: grid, VADER, profanity, HF classifiers, Python callables). Its recipe
(`tcsm finetune reward`; the grid demo is `tcsm demo grid`) is `tcsm.recipes.reward`."""
