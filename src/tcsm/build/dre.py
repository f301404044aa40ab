"""Density-ratio post-training builders (MATH.md §5.1): the energy model, the DRE objective."""
