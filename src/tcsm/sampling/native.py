"""`sample.method=native`: a model's own sampler, for models that bring one (`native_generate`): DiffusionGemma's
`generate()` (entropy-bound acceptance, renoising and self-conditioning, its generation_config), drawn canvas by
canvas after a prompt. `sample.steps` is its number of denoising steps per canvas; with the decode engine
(`sample.engine`, on by default on CUDA) it runs on the model's own static cache where that is exact."""

from __future__ import annotations

import torch

from tcsm.core.errors import ConfigError
from tcsm.sampling.engine import resolve_engine
from tcsm.sampling.registry import Sampler, SamplerSettings, register_sampler
from tcsm.sampling.samplers import SamplingStats

__all__ = ["Native"]


def _prompt(fixed, values) -> torch.Tensor | None:
    """The common prefix that `fixed` pins in every row, as [B, P]; ConfigError for pins that are not one prefix."""
    if fixed is None or not bool(fixed.any()):
        return None
    P = int(fixed[0].long().cumprod(0).sum())
    if not (bool(fixed[:, :P].all()) and not bool(fixed[:, P:].any())):
        raise ConfigError("sample.method=native continues a prompt (the same number of leading tokens in every row); "
                          "infilling needs one of tcsm's samplers")  # fmt: skip
    return values[:, :P]


@register_sampler
class Native(Sampler):
    name = "native"
    help = "the model's own sampler (DiffusionGemma's generate()); steps: its denoising steps per canvas"
    settings_type = SamplerSettings
    whole_sequence = True

    def __call__(self, model, path, num, length, *, objective=None, generator=None, device=None, fixed=None,
                 values=None, callback=None, chunk_size=None, record_steps=None):  # fmt: skip
        own = getattr(model, "native_generate", None)
        if not callable(own):
            raise ConfigError(f"sample.method=native needs a model with its own sampler; a {type(model).__name__} "
                              "has none: choose another sample.method")  # fmt: skip
        if record_steps:
            raise ConfigError("sample.method=native keeps no trajectory: leave out record_steps")
        prompt = _prompt(fixed, values)
        if prompt is None:
            prompt = torch.empty(num, 0, dtype=torch.long, device=device)
        if prompt.shape[1] >= int(length):
            raise ConfigError(f"the prompt ({prompt.shape[1]} tokens) fills the whole sample length {int(length)}: "
                              "nothing is left to draw; ask for new tokens (--max-new-tokens N) or a longer "
                              "--length")  # fmt: skip
        steps = int(self.settings.steps)
        engine = resolve_engine(getattr(self.settings, "engine", "auto"), device if device is not None else "cpu")
        tokens, calls = own(prompt, length, steps=steps, generator=generator, device=device, engine=engine)
        stats = SamplingStats(method=self.name, num_steps=steps, cached=True, times=torch.empty(0), num_calls=calls,
                              num_rows=calls * num)  # fmt: skip
        return tokens, stats
