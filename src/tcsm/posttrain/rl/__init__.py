"""Reinforcement learning with verifiable rewards for diffusion LMs, the GRPO family (MATH.md §5.2's link to RL):
`advantages` (group-relative advantages), `estimators` (the sequence log-likelihood each method uses: diffu-GRPO's
one-step estimate, the ELBO from the path's bound with SPG's upper bound for negative advantages, the exact
likelihood of an autoregressive model), `loss` (the PPO-style clipped ratio with a k3 KL to the reference) and
`objective` (rollout groups drawn by the run's sampler, scored, buffered for the inner updates). Its recipe
(`tcsm finetune rl`) is `tcsm.recipes.rl`."""
