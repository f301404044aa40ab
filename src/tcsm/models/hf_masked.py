"""A masked diffusion LM shipped as a Hugging Face directory with its own modeling code (LLaDA, Dream and the
converted Llama / Qwen models: bidirectional blocks, `forward(input_ids) → logits`, a `mask_token_id` in the config,
no time input) as a tcsm masked denoiser, unchanged (MATH.md §1.3: the masked posterior p_{1|t}(· | x_t) does not
depend on t, so a model without a time input is a complete denoiser of the masked path).

`HFMaskedDLM(hf_model, vocab_size, mask_token_id, shift_logits=False)`: x_t [B, L] with ids in {0..V} → logits
[B, L, V]. How tcsm's conventions meet the model's:

* clean tokens are the model's own ids 0..V−1 (the data is tokenized with the model's tokenizer; V may be smaller
  than the embedding matrix, which is often padded);
* tcsm's mask input V becomes the model's `mask_token_id`. When that id lies inside 0..V−1 (LLaDA's <|mdm_mask|>
  is a token of its vocabulary) it is not a clean token: its logit is pushed to `MASK_LOGIT`, so p^θ gives it
  probability 0 to float precision (a finite value, so that p · log p stays 0 in every loss and sampler);
* Dream-style shifted logits (the output at position i predicts token i + 1): with `shift_logits`, the logits of
  position i are the output at i − 1, and position 0 keeps its own output (as Dream's own generation does).

The state dict carries the model's own parameter names (no prefix, tied copies dropped, as `save_pretrained` writes
them), so a checkpoint's weights are the directory's `model.safetensors`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tcsm.models.config import ModelConfig
from tcsm.models.kinds import FAMILIES

__all__ = ["MASK_LOGIT", "HFMaskedDLM", "HFMaskedDLMConfig"]

#: the logit of the model's mask id when it lies among the clean ids: probability e^{-1e4} = 0 in float32
MASK_LOGIT = -1.0e4


@dataclass
class HFMaskedDLMConfig(ModelConfig):
    """What the samplers and checks ask a denoiser's `cfg` for."""

    vocab_size: int
    num_states: int
    max_len: int
    mask_token_id: int
    shift_logits: bool = False
    time_conditioning: bool = False


class HFMaskedDLM(nn.Module):
    """x_t [B, L] (ids ≤ V, V = [MASK]), t (ignored) → logits [B, L, V] of a Hugging Face masked diffusion LM."""

    model_kind = FAMILIES["hf_masked_dlm"]

    def __init__(self, hf_model: nn.Module, vocab_size: int, mask_token_id: int, *, shift_logits: bool = False,
                 max_len: int | None = None):  # fmt: skip
        super().__init__()
        rows = hf_model.get_input_embeddings().weight.shape[0]
        V, mask = int(vocab_size), int(mask_token_id)
        if not 0 < V <= rows:
            raise ValueError(f"the data has {V} tokens but the model embeds {rows}; use the model's own tokenizer")
        if not 0 <= mask < rows:
            raise ValueError(f"mask_token_id {mask} is outside the model's vocabulary [0, {rows})")
        self.hf = hf_model
        config = getattr(hf_model, "config", None)
        if max_len is None:
            max_len = getattr(config, "max_position_embeddings", None) or getattr(config, "max_sequence_length", None)
        self.cfg = HFMaskedDLMConfig(V, V + 1, int(max_len or 1 << 16), mask, bool(shift_logits))
        self.vocab_size, self.num_states, self.mask_id = V, V + 1, V
        # Names of parameters that are the same tensor as an earlier one (tied embeddings): not saved twice.
        seen: dict[int, str] = {}
        self._tied: dict[str, str] = {}
        for name, p in hf_model.named_parameters(remove_duplicate=False):
            if id(p) in seen:
                self._tied[name] = seen[id(p)]
            else:
                seen[id(p)] = name
        self._register_state_dict_hook(_to_hf_names)
        self._register_load_state_dict_pre_hook(_from_hf_names, with_module=True)

    def input_ids(self, xt: Tensor) -> Tensor:
        """The model's input ids: tcsm's [MASK] (V) → the model's mask_token_id, clean ids unchanged."""
        return torch.where(xt >= self.vocab_size, torch.full_like(xt, self.cfg.mask_token_id), xt)

    def forward(self, xt: Tensor, t: Tensor | None = None) -> Tensor:
        """Logits [B, L, V] of x^i given x_t (MATH.md §1.3); t is not an input of these models."""
        if xt.dim() != 2:
            raise ValueError(f"xt must be a [batch, length] tensor of token ids, got shape {tuple(xt.shape)}")
        if xt.shape[1] > self.cfg.max_len:
            raise ValueError(f"sequence length {xt.shape[1]} exceeds the model's max_len={self.cfg.max_len}")
        out = self.hf(input_ids=self.input_ids(xt))
        logits = (out.logits if hasattr(out, "logits") else out[0])[..., : self.vocab_size].float()
        if self.cfg.shift_logits:  # output i predicts token i + 1
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        if self.cfg.mask_token_id < self.vocab_size:  # the mask token is never a clean value
            logits = logits.clone()
            logits[..., self.cfg.mask_token_id] = MASK_LOGIT
        return logits


def _to_hf_names(module: HFMaskedDLM, state: dict, prefix: str, local_metadata) -> dict:
    """state_dict hook: `hf.<name>` → `<name>`, tied copies dropped (what `save_pretrained` writes)."""
    start = prefix + "hf."
    for key in [k for k in state if k.startswith(start)]:
        value = state.pop(key)
        name = key[len(start):]
        if name not in module._tied:
            state[prefix + name] = value
    return state


def _from_hf_names(module: HFMaskedDLM, state: dict, prefix: str, *args) -> None:
    """load_state_dict pre-hook: `<name>` → `hf.<name>`, each tied copy filled from the weight it is tied to."""
    for key in [k for k in state if k.startswith(prefix) and not k.startswith(prefix + "hf.")]:
        state[prefix + "hf." + key[len(prefix):]] = state.pop(key)
    for name, source in module._tied.items():
        if prefix + "hf." + source in state:
            state.setdefault(prefix + "hf." + name, state[prefix + "hf." + source])
