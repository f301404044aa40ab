"""Reward fine-tuning, the math (MATH.md §5.2): `targets` (N^1 tilted conditionals, N^full self-normalised
importance weights); the reward functions are shared by every method (`tcsm.rewards`). Its recipe
(`tcsm finetune reward`; the grid demo is `tcsm demo grid`) is `tcsm.recipes.reward`."""
