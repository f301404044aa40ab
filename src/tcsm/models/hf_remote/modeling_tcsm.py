"""A tcsm discrete-diffusion model in Hugging Face form (`tcsm export`), loaded with
`AutoModelForMaskedLM.from_pretrained(dir, trust_remote_code=True)` (denoisers) or `AutoModel` (energy models).

Self-contained: torch and transformers only, so the directory works where tcsm is not installed. The layers
and parameter names are tcsm's (`tcsm.models.transformer.Denoiser`, `tcsm.posttrain.dre.ratio_head.RatioHead`), so
`model.safetensors` is the run's own state dict and the logits are the run's.

`TCSMForMaskedLM.forward(input_ids, timesteps)`: input_ids [B, L] are noisy tokens x_t (ids < V, plus [MASK] = V
for the masked source), timesteps [B] (or a scalar) the time t in [0, 1] with t = 1 clean (tcsm's convention:
the opposite of MDLM / SEDD's); returns logits [B, L, V] over the clean tokens. A model without time
conditioning ignores `timesteps`.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import MaskedLMOutput, ModelOutput

from .configuration_tcsm import TCSMConfig, TCSMEnergyConfig, TCSMHFDenoiserConfig


class LayerNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.layer_norm(x.float(), (x.shape[-1],), self.weight.float(), None, self.eps).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def make_norm(kind, dim):
    return RMSNorm(dim) if kind == "rmsnorm" else LayerNorm(dim)


def rotary_tables(length, head_dim, base, device):
    """(cos, sin) [L, head_dim] for positions 0..L−1 (rotate-half pairing), computed as tcsm computes them."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    freqs = torch.outer(torch.arange(length, dtype=torch.float32, device=device), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rotary(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def modulate(x, shift, scale):
    return x.to(shift.dtype) * (1 + scale[:, None, :]) + shift[:, None, :]


class Attention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, rope, attn_mask=None):
        b, n, _ = x.shape
        qkv = self.qkv(x).view(b, n, 3, self.n_heads, self.head_dim)
        cos, sin = (r[:n, None, None].to(x.dtype) for r in rope)
        q, k = apply_rotary(qkv[:, :, :2], cos, sin).unbind(2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), qkv[:, :, 2].transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.out(y.transpose(1, 2).reshape(b, n, self.d_model))


class MLP(nn.Module):
    def __init__(self, d_model, mlp_ratio, activation):
        super().__init__()
        hidden = round(mlp_ratio * d_model)
        self.fc = nn.Linear(d_model, hidden)
        self.proj = nn.Linear(hidden, d_model)
        self.approximate = "tanh" if activation == "gelu_tanh" else "none"

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate=self.approximate))


class Block(nn.Module):
    """Pre-norm bidirectional block with adaLN(-Zero) time conditioning when `cond_dim` is set."""

    def __init__(self, d_model, n_heads, mlp_ratio, cond_dim, norm, activation):
        super().__init__()
        self.norm1 = make_norm(norm, d_model)
        self.attn = Attention(d_model, n_heads)
        self.norm2 = make_norm(norm, d_model)
        self.mlp = MLP(d_model, mlp_ratio, activation)
        self.cond_dim = cond_dim
        if cond_dim is not None:
            self.adaLN = nn.Sequential(nn.SiLU(), nn.Linear(cond_dim, 6 * d_model))

    def forward(self, x, rope, cond, attn_mask=None):
        if cond is None:
            x = x + self.attn(self.norm1(x), rope, attn_mask)
            return x + self.mlp(self.norm2(x))
        shift1, scale1, gate1, shift2, scale2, gate2 = self.adaLN(cond).chunk(6, dim=-1)
        x = x + gate1[:, None, :] * self.attn(modulate(self.norm1(x), shift1, scale1), rope, attn_mask)
        return x + gate2[:, None, :] * self.mlp(modulate(self.norm2(x), shift2, scale2))


class TimestepEmbedder(nn.Module):
    def __init__(self, cond_dim, freq_dim=256, scale=1000.0, max_period=10000.0):
        super().__init__()
        self.freq_dim, self.scale, self.max_period = freq_dim, scale, max_period
        self.mlp = nn.Sequential(nn.Linear(freq_dim, cond_dim), nn.SiLU(), nn.Linear(cond_dim, cond_dim))

    def forward(self, t):
        half = self.freq_dim // 2
        freqs = torch.exp(
            -math.log(self.max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half
        )
        args = (self.scale * t.float())[:, None] * freqs[None, :]
        return self.mlp(torch.cat([torch.cos(args), torch.sin(args)], dim=-1))


def build_trunk(module, c, activation):
    """The trunk tcsm's Denoiser and RatioHead share, as attributes of `module` (tcsm's parameter names)."""
    module.c = dict(c)
    module.embed = nn.Embedding(c["num_states"], c["d_model"])
    tc = bool(c.get("time_conditioning", True))
    cond_dim = c["cond_dim"] if tc else None
    module.time_embed = TimestepEmbedder(c["cond_dim"]) if tc else None
    module.blocks = nn.ModuleList(
        Block(c["d_model"], c["n_heads"], c.get("mlp_ratio", 4), cond_dim, c.get("norm", "layernorm"), activation)
        for _ in range(c["n_layers"])
    )
    module.final_norm = make_norm(c.get("norm", "layernorm"), c["d_model"])
    module.final_adaLN = nn.Sequential(nn.SiLU(), nn.Linear(c["cond_dim"], 2 * c["d_model"])) if tc else None


def run_trunk(module, h, timesteps, attn_mask=None):
    c = module.c
    cos, sin = rotary_tables(h.shape[1], c["d_model"] // c["n_heads"], float(c.get("rope_base", 10000.0)), h.device)
    cond = None
    if module.time_embed is not None:
        if timesteps is None:
            raise ValueError("this model is time-conditioned: pass timesteps (t in [0, 1], t = 1 clean) of shape [batch]")
        t = torch.as_tensor(timesteps, device=h.device).reshape(-1).expand(h.shape[0])
        cond = module.time_embed(t)
    for block in module.blocks:
        h = block(h, (cos, sin), cond, attn_mask)
    h = module.final_norm(h)
    if module.final_adaLN is not None:
        shift, scale = module.final_adaLN(cond).chunk(2, dim=-1)
        h = modulate(h, shift, scale)
    return h


def _key_mask(attention_mask):
    """[B, L] 1 = real token → a boolean [B, 1, 1, L] key mask for SDPA (None when everything is attended)."""
    if attention_mask is None or bool(attention_mask.bool().all()):
        return None
    return attention_mask.bool()[:, None, None, :]


class Denoiser(nn.Module):
    """tcsm's Denoiser: x_t [B, L], t [B] → logits [B, L, V]."""

    def __init__(self, c):
        super().__init__()
        build_trunk(self, c, c.get("activation", "gelu"))
        self.head = nn.Linear(c["d_model"], c["vocab_size"])

    def forward(self, input_ids, timesteps=None, attention_mask=None):
        h = run_trunk(self, self.embed(input_ids), timesteps, _key_mask(attention_mask))
        return self.head(h).float()


class RatioHead(nn.Module):
    """tcsm's RatioHead: f(x_1, x_t, t) [B] (mean-pooled trunk over emb(x_t) + emb_1(x_1))."""

    def __init__(self, c):
        super().__init__()
        build_trunk(self, c, "gelu_tanh")
        self.embed_clean = nn.Embedding(c["vocab_size"], c["d_model"])
        self.out = nn.Linear(c["d_model"], 1)

    def forward(self, clean_ids, noisy_ids, timesteps=None):
        h = run_trunk(self, self.embed(noisy_ids) + self.embed_clean(clean_ids), timesteps)
        return self.out(h.mean(dim=1)).squeeze(-1).float()


class TCSMPreTrainedModel(PreTrainedModel):
    config_class = TCSMConfig
    base_model_prefix = "tcsm"
    supports_gradient_checkpointing = False
    _no_split_modules = ("Block",)

    def _init_weights(self, module):
        # GPT-2-style normal init for a model built from a config alone; from_pretrained overwrites every weight.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, (LayerNorm, RMSNorm)):
            nn.init.ones_(module.weight)


class TCSMForMaskedLM(TCSMPreTrainedModel):
    """forward(input_ids = x_t, timesteps = t) → MaskedLMOutput(logits [B, L, V]); `labels` (clean ids, −100
    ignored) adds the cross-entropy of the clean tokens."""

    def __init__(self, config):
        super().__init__(config)
        c = config.denoiser
        build_trunk(self, c, c.get("activation", "gelu"))
        self.head = nn.Linear(c["d_model"], c["vocab_size"])
        self.post_init()

    def get_input_embeddings(self):
        return self.embed

    def get_output_embeddings(self):
        return None  # the head maps to V clean tokens, the embedding holds V (+1 mask) inputs: never tied

    def forward(self, input_ids, timesteps=None, attention_mask=None, labels=None, return_dict=True, **kwargs):
        h = run_trunk(self, self.embed(input_ids), timesteps, _key_mask(attention_mask))
        logits = self.head(h).float()
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
        if not return_dict:
            return (logits,) if loss is None else (loss, logits)
        return MaskedLMOutput(loss=loss, logits=logits)


class TCSMEnergyModel(TCSMPreTrainedModel):
    """An energy (strategy-ii DRE) run: p(x_1 | x_t) ∝ p^ref(x_1 | x_t) e^{f(x_1, x_t, t)}. forward(input_ids = x_1,
    noisy_ids = x_t, timesteps = t) → energy f [B] and the reference's logits [B, L, V] at x_t."""

    config_class = TCSMEnergyConfig

    def __init__(self, config):
        super().__init__(config)
        self.reference = Denoiser(config.denoiser)
        self.head = RatioHead(config.ratio_head)
        self.post_init()

    def get_input_embeddings(self):
        return self.reference.embed

    def forward(self, input_ids, noisy_ids, timesteps=None, return_dict=True, **kwargs):
        energy = self.head(input_ids, noisy_ids, timesteps)
        logits = self.reference(noisy_ids, timesteps)
        if not return_dict:
            return energy, logits
        return ModelOutput(energy=energy, logits=logits)


class TCSMHFDenoiserForMaskedLM(TCSMPreTrainedModel):
    """A denoiser tcsm adapted from a pretrained Hugging Face masked or causal LM (`model.name=hf_denoiser`): the
    base architecture (`config.base_model`) under `hf`, our V tokens' HF ids (`token_ids`), a trainable [MASK]
    vector, and for a causal LM a BOS at position 0 whose outputs 0..L−1 give the logits of x^0..x^{L−1}, with
    bidirectional attention unless `denoiser.bidirectional` is false. forward(input_ids = x_t, timesteps = t)."""

    config_class = TCSMHFDenoiserConfig

    def __init__(self, config):
        super().__init__(config)
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

        c = config.denoiser
        base = dict(config.base_model)
        inner = AutoConfig.for_model(base.pop("model_type"), **base)
        auto = AutoModelForMaskedLM if c["kind"] == "mlm" else AutoModelForCausalLM
        self.hf = auto.from_config(inner)
        V, d = c["vocab_size"], self.hf.get_input_embeddings().weight.shape[1]
        self.register_buffer("token_ids", torch.arange(V))
        self.mask_embed = nn.Parameter(torch.zeros(d)) if c["num_states"] == V + 1 else None
        if c["kind"] == "causal":
            self.register_buffer("bos_id", torch.tensor(0))
        tc = bool(c.get("time_conditioning"))
        self.time_embed = TimestepEmbedder(c["cond_dim"]) if tc else None
        self.time_proj = nn.Linear(c["cond_dim"], d) if tc else None
        self.post_init()

    def get_input_embeddings(self):
        return self.hf.get_input_embeddings()

    def forward(self, input_ids, timesteps=None, return_dict=True, **kwargs):
        c, emb = self.config.denoiser, self.hf.get_input_embeddings()
        V = c["vocab_size"]
        h = emb(self.token_ids[input_ids.clamp(max=V - 1)])
        if self.mask_embed is not None:
            h = torch.where((input_ids >= V)[..., None], self.mask_embed.to(h.dtype), h)
        if self.time_embed is not None:
            if timesteps is None:
                raise ValueError("this model is time-conditioned: pass timesteps (t in [0, 1], t = 1 clean)")
            t = torch.as_tensor(timesteps, device=h.device).reshape(-1).expand(h.shape[0])
            h = h + self.time_proj(self.time_embed(t)).to(h.dtype)[:, None, :]
        extra = {}
        if c["kind"] == "causal":
            h = torch.cat([emb(self.bos_id.expand(h.shape[0], 1)), h], dim=1)
            if c.get("bidirectional", True):
                n = h.shape[1]
                extra["attention_mask"] = torch.zeros(h.shape[0], 1, n, n, dtype=h.dtype, device=h.device)
        logits = self.hf(inputs_embeds=h, **extra).logits[:, : input_ids.shape[1]]
        logits = logits[..., self.token_ids].float()
        return MaskedLMOutput(logits=logits) if return_dict else (logits,)
