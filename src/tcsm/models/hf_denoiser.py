"""A diffusion denoiser made from a pretrained Hugging Face language model (masked or causal): the model is the
denoiser m_θ(· | x_t) itself, not a teacher (MATH.md §0, §1.2; the "AR → diffusion" adaptation of DiffuLLaMA /
Dream / dllm's A2D).

`HFDenoiser(hf_model, token_ids, kind=...)`: x_t [B, L] with ids < num_states (V = [MASK] for the masked source),
t [B] → logits [B, L, V] over our clean tokens, the HF logits restricted to `token_ids` (our token y is HF id
token_ids[y]). What the adaptation changes, and why step 0 is the pretrained model:

* inputs: the HF embedding of each clean token; [MASK] is a trainable vector that starts as the HF mask token's
  embedding (a masked LM: exactly its input; a causal LM whose tokenizer has a mask token: `mask_token_id`) or
  else the mean embedding;
* a causal LM's shift: its output at position j predicts token j + 1, so the input is [BOS, x_t^0 .. x_t^{L−1}]
  and the outputs at positions 0..L−1 are the logits of x^0..x^{L−1} (DiffuLLaMA's shift);
* attention: a causal LM's attention is made bidirectional (an all-zero additive 4-D mask replaces the causal
  one) unless `bidirectional=False`, which keeps the pretrained AR model exactly (then forward = its next-token
  logits, tested);
* time: with `time_conditioning`, a sinusoidal embedding of t goes through a zero-initialised linear layer and
  is added to every input embedding, so the conditioned model starts equal to the unconditioned one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tcsm.models.config import ModelConfig
from tcsm.models.kinds import HF_DENOISER
from tcsm.models.layers import TimestepEmbedder, zero_init_

__all__ = ["HFDenoiser", "HFDenoiserConfig", "auto_class_kind"]


@dataclass
class HFDenoiserConfig(ModelConfig):
    """What the samplers and checks ask a denoiser's `cfg` for, and how the HF model is adapted."""

    vocab_size: int
    num_states: int
    max_len: int
    kind: str = "mlm"  # mlm | causal
    time_conditioning: bool = False
    cond_dim: int = 128
    bidirectional: bool = True


def auto_class_kind(config: dict) -> str:
    """The transformers auto-class family of the LM an HF denoiser's saved config was started from: "MASKED_LM" for a
    masked LM, "CAUSAL_LM" for a causal one (`MODEL_FOR_<kind>_MAPPING_NAMES`)."""
    return "MASKED_LM" if config.get("kind", "mlm") == "mlm" else "CAUSAL_LM"


class HFDenoiser(nn.Module):
    """x_t [B, L] (ids < num_states), t [B] → logits [B, L, V] from a pretrained HF masked or causal LM."""

    model_kind = HF_DENOISER

    def __init__(
        self,
        hf_model: nn.Module,
        token_ids,
        *,
        kind: str,
        num_states: int,
        special_token_id: int | None = None,
        mask_token_id: int | None = None,
        time_conditioning: bool = False,
        cond_dim: int = 128,
        bidirectional: bool = True,
        max_len: int | None = None,
    ):
        super().__init__()
        if kind not in ("mlm", "causal"):
            raise ValueError(f"kind must be 'mlm' or 'causal', got {kind!r}")
        self.hf = hf_model
        emb = hf_model.get_input_embeddings().weight
        ids = torch.as_tensor([int(i) for i in token_ids], dtype=torch.long)
        V = int(ids.numel())
        if num_states not in (V, V + 1):
            raise ValueError(f"num_states must be V={V} (uniform) or V+1={V + 1} (masked), got {num_states}")
        # Persistent: a checkpoint (and an export) then says which HF ids its V tokens are.
        self.register_buffer("token_ids", ids)
        self.vocab_size, self.num_states, self.kind = V, int(num_states), kind
        hf_cfg = getattr(hf_model, "config", None)
        positions = getattr(hf_cfg, "max_position_embeddings", None) or getattr(hf_cfg, "n_positions", None)
        if max_len is None:
            max_len = int(positions) - (kind == "causal") if positions else 1 << 16
        self.cfg = HFDenoiserConfig(V, int(num_states), int(max_len), kind, bool(time_conditioning), int(cond_dim),
                                    bool(bidirectional))  # fmt: skip
        self.mask_embed = None
        if num_states == V + 1:
            own = special_token_id if kind == "mlm" else mask_token_id  # a causal LM's BOS is its special id
            start = emb[int(own)] if own is not None else emb.mean(0)
            self.mask_embed = nn.Parameter(start.detach().clone())
        if kind == "causal":
            bos = special_token_id if special_token_id is not None else getattr(hf_cfg, "bos_token_id", None)
            if bos is None:
                raise ValueError("a causal LM needs a BOS id for position 0: set model.special_token_id")
            self.register_buffer("bos_id", torch.tensor(int(bos)))
        self.time_embed = TimestepEmbedder(cond_dim) if time_conditioning else None
        self.time_proj = zero_init_(nn.Linear(cond_dim, emb.shape[1])) if time_conditioning else None

    def _inputs(self, xt: Tensor, t: Tensor | None) -> Tensor:
        emb = self.hf.get_input_embeddings()
        V = self.vocab_size
        h = emb(self.token_ids[xt.clamp(max=V - 1)])
        if self.mask_embed is not None:
            h = torch.where((xt >= V)[..., None], self.mask_embed.to(h.dtype), h)
        if self.time_embed is not None:
            if t is None:
                raise ValueError("this denoiser is time-conditioned: pass t of shape [batch]")
            t = torch.as_tensor(t, device=xt.device).reshape(-1).expand(xt.shape[0])
            h = h + self.time_proj(self.time_embed(t)).to(h.dtype)[:, None, :]
        if self.kind == "causal":
            h = torch.cat([emb(self.bos_id.expand(xt.shape[0], 1)), h], dim=1)
        return h

    def forward(self, xt: Tensor, t: Tensor | None = None) -> Tensor:
        if xt.dim() != 2:
            raise ValueError(f"xt must be a [batch, length] tensor of token ids, got shape {tuple(xt.shape)}")
        if xt.shape[1] > self.cfg.max_len:
            raise ValueError(f"sequence length {xt.shape[1]} exceeds the model's max_len={self.cfg.max_len}")
        h = self._inputs(xt, t)
        kwargs = {}
        if self.kind == "causal" and self.cfg.bidirectional:
            n = h.shape[1]
            kwargs["attention_mask"] = torch.zeros(h.shape[0], 1, n, n, dtype=h.dtype, device=h.device)
        out = self.hf(inputs_embeds=h, **kwargs)
        logits = out.logits if hasattr(out, "logits") else out[0]
        if self.kind == "causal":
            logits = logits[:, : xt.shape[1]]
        return logits[..., self.token_ids].float()
