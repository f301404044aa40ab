"""Reward fine-tuning (MATH.md §5.2): `targets` (N^1 tilted conditionals, N^full self-normalised importance
weights), `rewards` (reward functions: grid, VADER, profanity, HF classifiers, Python callables), `builder`
(config schema, registry entry, reward-domain checks), `recipe` (run config and report). Command:
`tcsm finetune reward`; the grid demo is `tcsm demo grid`."""
