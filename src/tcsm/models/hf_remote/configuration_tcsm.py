"""Configuration of a tcsm model exported in Hugging Face format (`tcsm export`). Self-contained: it imports
`transformers` only, so the exported directory loads where tcsm is not installed (trust_remote_code=True)."""

from transformers import PretrainedConfig


class TCSMConfig(PretrainedConfig):
    """`kind`: "denoiser" (logits over the V clean tokens) or "energy" (a denoiser reference and a log-ratio head).
    `denoiser` / `ratio_head`: the architecture fields of tcsm's DenoiserConfig / RatioHeadConfig. `source`: the
    noise source ("masked": input id V is [MASK]; "uniform"). Time runs from t = 0 (all noise) to t = 1 (clean).
    `sampling`: the run's sampler settings; `tcsm`: the run's config and provenance (what tcsm reads back)."""

    model_type = "tcsm"

    def __init__(
        self, kind="denoiser", denoiser=None, ratio_head=None, source="masked", mask_id=None, sampling=None,
        tcsm=None, **kwargs,
    ):
        self.kind = kind
        self.denoiser = dict(denoiser or {})
        self.ratio_head = dict(ratio_head) if ratio_head else None
        self.source = source
        self.mask_id = mask_id
        self.sampling = dict(sampling or {})
        self.tcsm = dict(tcsm or {})
        kwargs.setdefault("tie_word_embeddings", False)
        if self.denoiser:
            kwargs.setdefault("vocab_size", self.denoiser.get("vocab_size"))
        super().__init__(**kwargs)


# One config class per model class: transformers registers each (config class → model class) pair it loads with
# trust_remote_code, so two kinds sharing a config class would load as whichever came first in a process.
class TCSMEnergyConfig(TCSMConfig):
    pass


class TCSMHFDenoiserConfig(TCSMConfig):
    """`base_model`: the pretrained Hugging Face model's config (its architecture; the weights are ours)."""

    def __init__(self, base_model=None, **kwargs):
        self.base_model = dict(base_model or {})
        super().__init__(**kwargs)
