"""Rewards: functions of token sequences [B, L] → [B] (`functions`: the built-in ones, `make_reward` from a spec
string, `evaluate_reward`). A shared concept, below the post-training methods that use them (reward tilts, GRPO,
the preference pairs of `tcsm pairs`, the grid demo), so no method imports another's package for them."""
