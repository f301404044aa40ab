"""Recipes: the paper's post-training procedures as run configurations (and their reports) over the one Trainer."""
