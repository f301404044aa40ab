"""What a model is, declared by the model rather than probed by its users (DESIGN.md "capabilities are declared"):
its `family`, whether it is a diffusion denoiser or an LM of the data p_1, not a diffusion model (MATH.md §4), how it is sampled, what
its likelihood is and what `tcsm export` writes for it. Every model class carries a `model_kind`, and
`kind_of(model)` answers for any model (wrapped or not). The kind a config's `model.name` selects is declared by the
family's registry entry (`tcsm.builders.registry.family_of_name`), beside its builder."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BLOCK_DENOISER", "CAUSAL", "DENOISER", "ENERGY", "HF_CAUSAL", "HF_DENOISER", "HF_MLM", "HOLLOW",
           "JOINT_STEP_BLOCK_DENOISER", "JOINT_STEP_DENOISER", "MLM", "UNDECLARED", "ModelKind",
           "denoise", "kind_of"]


@dataclass(frozen=True)
class ModelKind:
    """The declaration a model class carries as `model_kind`: what its users ask instead of its class."""

    #: "denoiser" (p^θ_{1|t}), "mlm" / "causal" / "hollow" (LMs of the data p_1), "energy" (p^ref · e^f)
    family: str
    #: "path": the diffusion samplers; "blocks": block by block with a KV cache, a path sampler inside each block
    #: (MATH.md §9); "none": no sampler of whole sequences (single-site conditionals only); any other value names the
    #: registered sampler its objective brings (`own_sampler`): "left_to_right" (an autoregressive draw), "sir" (SIR
    #: over the reference, MATH.md §6.3)
    sampler: str
    #: what `tcsm export` writes ("denoiser" | "hf_denoiser" | "energy" | "joint_step_denoiser", the last for tcsm
    #: alone), or None: not exportable
    export: str | None
    #: what it is, for messages ("an autoregressive LM (a teacher for tcsm distill)")
    description: str
    #: what `tcsm eval` reports: "bound" (the path's NELBO, MATH.md §2.4), "nll" (the LM's own
    #: NLL), "estimate" (an importance-sampling estimate with log Ẑ from n reference draws per sequence and time,
    #: MATH.md §6.3: costly, so it is bounded to a few examples by default)
    likelihood: str = "bound"
    #: a block denoiser (MATH.md §9): its logits of block b read the noisy block and the clean blocks before it, so
    #: it is called as `model(x_t, t, x1=x_1)` and decoded block by block with its KV cache
    blocks: bool = False
    #: optional training inputs and outputs it offers (MATH.md §9): "encoder_lm" (`model(x_t, t, x1=x_1,
    #: encoder_logits=True)` also gives its clean encoder's next-token logits), "self_conditioning" (`self_cond=`
    #: logits and a per-sequence `self_cond_mask=`), "router" (`model.router_parameters()`: its MoE routing),
    #: "decode_from" (`decode_from=` a block boundary: only the blocks from there on are decoded), "joint_step" (a
    #: step head, MATH.md §10: `model(x_t, t, reveal=R, tokens=y)` gives the logits of each revealed position given
    #: the tokens drawn at the revealed positions before it, and `model.step_head` draws a step's tokens jointly),
    #: "positions" (`model(x_t, t, at=M)` gives the logits [N, V] at the positions M [B, L] only, in the order of
    #: `logits[M]`: a masked step reveals few positions, and the output layer is a large share of a call)
    offers: frozenset = frozenset()
    #: state-dict prefixes a warm start (`train.init_from`) from a model without them keeps at their initialisation
    #: (a step head added to a teacher's denoiser)
    fresh: tuple[str, ...] = ()

    @property
    def is_autoregressive(self) -> bool:
        """An autoregressive LM: its sequence likelihood is exact, Π_i p(x^i | x^{<i})."""
        return self.family == "causal"

    @property
    def estimated_likelihood(self) -> bool:
        """Whether `tcsm eval` reports an importance-sampling estimate (costly), not a bound or an exact NLL."""
        return self.likelihood == "estimate"

    @property
    def draws_sequences(self) -> bool:
        """Whether the model has a sampler of whole sequences (an LM of single-site conditionals has none)."""
        return self.sampler != "none"

    @property
    def own_sampler(self) -> str | None:
        """The registered sampler the model's objective brings (`sampling.registry`, e.g. "sir", "left_to_right"),
        or None: the run's `sample.method` chooses among the path samplers (inside each block for a block model)."""
        return None if self.sampler in ("path", "blocks", "none") else self.sampler

    @property
    def is_denoiser(self) -> bool:
        """A diffusion denoiser x_t ↦ p^θ(x_1 | x_t): what every `tcsm finetune` recipe starts from."""
        return self.family == "denoiser"


#: tcsm's own diffusion transformer
DENOISER = ModelKind("denoiser", "path", "denoiser", "a diffusion denoiser", offers=frozenset({"positions"}))
#: what a denoiser that declares nothing is taken to be (a test's exact denoiser, a user's function): it offers
#: nothing beyond `model(x_t, t)`
UNDECLARED = ModelKind("denoiser", "path", "denoiser", "a diffusion denoiser")
#: a block diffusion denoiser (MATH.md §9): decoded block by block with its KV cache ("blocks" sampler)
BLOCK_DENOISER = ModelKind("denoiser", "blocks", "denoiser", "a block diffusion denoiser", blocks=True,
                           offers=frozenset({"positions"}))
MLM = ModelKind("mlm", "none", None, "a masked LM (a teacher for target.name=parametric)", "nll")
CAUSAL = ModelKind(
    "causal", "left_to_right", None, "an autoregressive LM (a teacher for tcsm distill)", "nll"
)
HOLLOW = ModelKind("hollow", "none", None, "a Hollow LM (a teacher for target.name=parametric)", "nll")
ENERGY = ModelKind(
    "energy", "sir", "energy", "an energy model (tcsm finetune dre strategy ii; sampled by SIR)", "estimate"
)

#: a denoiser with a step head (MATH.md §10): the ancestral sampler draws each step's revealed tokens jointly
#: (exported for tcsm alone: the denoiser's modeling code for transformers would load it without its head)
JOINT_STEP_DENOISER = ModelKind("denoiser", "path", "joint_step_denoiser", "a few-step denoiser with a step head (draws "
                                "a step's tokens jointly)", offers=frozenset({"joint_step", "positions"}),
                                 fresh=("step_head.",))  # fmt: skip

#: a block denoiser with a step head (MATH.md §9, §10): each in-block step's revealed tokens drawn jointly, the head
#: reading one block at a time
JOINT_STEP_BLOCK_DENOISER = ModelKind("denoiser", "blocks", "joint_step_denoiser", "a few-step block denoiser with a "
                                      "step head (draws a step's tokens jointly inside each block)", blocks=True,
                                      offers=frozenset({"joint_step", "positions"}), fresh=("step_head.",))  # fmt: skip

HF_DENOISER = ModelKind("denoiser", "path", "hf_denoiser", "a diffusion denoiser started from a Hugging Face LM")
HF_MLM = ModelKind("mlm", "none", None, "a Hugging Face masked LM", "nll")
HF_CAUSAL = ModelKind("causal", "left_to_right", None, "a Hugging Face causal LM", "nll")


def kind_of(model) -> ModelKind:
    """The declared kind of `model`, seen through DDP / FSDP / torch.compile wrappers; a callable that declares
    nothing (a test's exact denoiser, a user's function) is a denoiser that offers nothing (`UNDECLARED`)."""
    for attr in ("_orig_mod", "module"):
        inner = getattr(model, attr, None)
        if inner is not None and hasattr(type(inner), "model_kind"):
            model = inner
    kind = getattr(type(model), "model_kind", None)
    return kind if isinstance(kind, ModelKind) else UNDECLARED


def denoise(model, xt, t, x1, reveal=None, clean=None, *, at=None):
    """The denoiser's logits at (x_t, t) for clean sequences x_1 [B, L]: a block denoiser reads the clean blocks
    before each noisy block from x_1 (MATH.md §9); a model with a step head, given a step's reveal set `reveal`
    [B, L], reads the tokens x_1 drawn there (MATH.md §10, the joint student), a block one its clean prefixes from
    `clean` (default x_1: the data, where x_1 holds other tokens at R); any other denoiser sees x_t and t. With `at`
    [B, L] (boolean) only the logits there, [N, V] in the order of `logits[at]`: projected there alone by a model
    that offers "positions", taken from its full logits by any other."""
    kind = kind_of(model)
    if reveal is not None and "joint_step" in kind.offers:
        if kind.blocks:
            logits = model(xt, t, x1=x1 if clean is None else clean, reveal=reveal, tokens=x1)
        else:
            logits = model(xt, t, reveal=reveal, tokens=x1)
        return logits if at is None else logits[at]
    where = {"x1": x1} if kind.blocks else {}
    if at is not None and "positions" in kind.offers:
        return model(xt, t, **where, at=at)
    logits = model(xt, t, **where)
    return logits if at is None else logits[at]
