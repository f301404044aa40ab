"""Preference fine-tuning builders (MATH.md §5.3): the pairwise objectives."""
