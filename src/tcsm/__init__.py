"""tcsm: Target Concrete Score Matching for discrete diffusion models."""

__version__ = "0.1.0"
