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


class RMSNorm(LayerNorm):
    """The same scale parameter as LayerNorm's, without the mean subtraction."""

    def __init__(self, dim, eps=1e-6):
        super().__init__(dim, eps)

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


def per_position(v):
    """Per-sequence [B, d] → [B, 1, d]; per-position [B, L, d] (a block model's times) as it is."""
    return v[:, None, :] if v.dim() == 2 else v


def modulate(x, shift, scale):
    return x.to(shift.dtype) * (1 + per_position(scale)) + per_position(shift)


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
        x = x + per_position(gate1) * self.attn(modulate(self.norm1(x), shift1, scale1), rope, attn_mask)
        return x + per_position(gate2) * self.mlp(modulate(self.norm2(x), shift2, scale2))


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


def run_trunk(module, h, timesteps, attn_mask=None, halves=1):
    """The trunk over h [B, n, d]; `halves` = 2: h is a block model's [x_t; x_1], both halves at positions 0..n/2−1,
    and timesteps [B, n] are per position."""
    c = module.c
    n = h.shape[1] // halves
    cos, sin = rotary_tables(n, c["d_model"] // c["n_heads"], float(c.get("rope_base", 10000.0)), h.device)
    cos, sin = cos.repeat(halves, 1), sin.repeat(halves, 1)
    cond = None
    if module.time_embed is not None:
        if timesteps is None:
            raise ValueError("this model is time-conditioned: pass timesteps (t in [0, 1], t = 1 clean) of shape [batch]")
        t = torch.as_tensor(timesteps, device=h.device)
        if t.dim() == 2:
            cond = module.time_embed(t.reshape(-1)).view(t.shape[0], t.shape[1], -1)
        else:
            cond = module.time_embed(t.reshape(-1).expand(h.shape[0]))
    for block in module.blocks:
        h = block(h, (cos, sin), cond, attn_mask)
    h = module.final_norm(h)
    if module.final_adaLN is not None:
        shift, scale = module.final_adaLN(cond).chunk(2, dim=-1)
        h = modulate(h, shift, scale)
    return h


def block_mask(length, block_length, device):
    """A block model's mask [2L, 2L] over [x_t; x_1] (True: may attend): a noisy token of block b sees the noisy
    block b and the clean blocks < b, a clean token of block b the clean blocks ≤ b."""
    pos = torch.arange(2 * length, device=device)
    block, clean = (pos % length) // block_length, pos >= length
    same, before = block[:, None] == block[None, :], block[:, None] > block[None, :]
    noisy_q = ~clean[:, None] & ((~clean[None, :] & same) | (clean[None, :] & before))
    return noisy_q | (clean[:, None] & clean[None, :] & (same | before))


def check_block_inputs(input_ids, clean_ids, k):
    """ValueError unless a block model of block length `k` is given clean_ids of input_ids' shape [batch, length],
    length a multiple of k."""
    if clean_ids is None:
        raise ValueError("a block model needs the clean sequence: pass clean_ids (x_1, the blocks before each block)")
    B, L = input_ids.shape
    if L % k or tuple(clean_ids.shape) != (B, L):
        raise ValueError(f"a block model takes input_ids and clean_ids of one shape [batch, length], length a multiple "
                         f"of {k}; got {tuple(input_ids.shape)} and {tuple(clean_ids.shape)}")  # fmt: skip


def block_forward(module, input_ids, clean_ids, timesteps, attention_mask):
    """Hidden states [B, L, d] of a block model's noisy half, all blocks in one pass over [x_t; x_1]: block b reads
    x_t^b, its time and x_1^{<b} (t per position [B, L], per sequence [B] or a scalar; clean tokens at t = 1)."""
    k = int(module.c["block_length"])
    check_block_inputs(input_ids, clean_ids, k)
    B, L = input_ids.shape
    mask = block_mask(L, k, input_ids.device)
    keys = _key_mask(attention_mask)
    if keys is not None:
        mask = mask & keys.repeat(1, 1, 1, 2)
    t = None
    if timesteps is not None:
        t = torch.as_tensor(timesteps, device=input_ids.device, dtype=torch.float32)
        t = t.reshape(B, L) if t.numel() == B * L and L > 1 else t.reshape(-1, 1).expand(B, L)
        t = torch.cat([t, torch.ones_like(t)], 1)
    h = run_trunk(module, module.embed(torch.cat([input_ids, clean_ids], 1)), t, mask, halves=2)
    return h[:, :L]


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


# --------------------------------------------------------------------------------------------------- generate


def _alpha(t, path):
    """α_t of the run's schedule (`config.tcsm["config"]["path"]`), t = 1 clean, as tcsm.paths.schedules computes it."""
    kind, kw = path.get("schedule", "linear"), dict(path.get("schedule_kwargs") or {})
    if kind == "cosine":
        return torch.where(t < 0.5, 2.0 * torch.sin(0.25 * math.pi * t) ** 2, 1.0 - torch.sin(0.5 * math.pi * (1.0 - t)))
    if kind == "polynomial":
        return t.pow(float(kw.get("exponent", 1.0)))
    if kind == "loglinear":
        eps = float(kw.get("eps", 0.0))
        return 1.0 - (1.0 - eps) * (1.0 - t)
    return t.clone()  # linear


def _grid(steps, kind, device):
    k = torch.arange(steps + 1, dtype=torch.float64, device=device) / steps
    grid = (1.0 - torch.cos(math.pi * k)) / 2.0 if kind == "cosine" else k
    grid[0], grid[-1] = 0.0, 1.0
    return grid


def _log_probs(logits, temperature, top_p):
    lp = torch.log_softmax(logits.double() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_lp, order = lp.sort(dim=-1, descending=True)
        p = sorted_lp.exp()
        drop = torch.zeros_like(p, dtype=torch.bool).scatter(-1, order, (p.cumsum(-1) - p) >= top_p)
        lp = torch.log_softmax(lp.masked_fill(drop, -torch.inf), dim=-1)
    return lp


def _draw(lp, generator):
    gumbel = -torch.log(-torch.log(torch.rand(lp.shape, generator=generator, device=lp.device, dtype=lp.dtype)
                                   .clamp_min(1e-300)))  # fmt: skip
    return (lp + gumbel).argmax(-1)


class DiffusionGenerationMixin:
    """`generate()` for a masked-source denoiser: the run's sampler defaults (`config.sampling`: steps, method,
    grid, temperature, top_p, final_argmax, semi_ar_block, threshold), its schedule, and a stop at end-of-text.

    Methods: "ancestral" (and every path sampler of tcsm: each masked position is revealed on the way from t to s
    with probability (α_s − α_t)/(1 − α_t)), or the decoding orders "random" | "confidence" | "margin" | "entropy"
    (c_{k+1} − c_k positions per step, c_k = round(M (α(t_k) − α(0)) / (α(1) − α(0))), ties broken at random) and
    "threshold" (every position more probable than `threshold`, at least one). `tcsm sample DIR` is the reference
    implementation; this one needs no tcsm."""

    @torch.no_grad()
    def generate(self, input_ids=None, *, num_samples=None, max_length=None, max_new_tokens=None, steps=None,
                 method=None, grid=None, temperature=None, top_p=None, final_argmax=None, semi_ar_block=None,
                 threshold=None, eos_token_id=None, pad_token_id=None, generator=None, block_length=None,
                 **unused):  # fmt: skip
        """input_ids [B, P] (optional): a prompt, kept; returns [B, L] token ids (prompt included) with
        L = max_length, or P + max_new_tokens, or the run's sequence length. After the first end-of-text token
        (`eos_token_id`, default the config's) every position is `pad_token_id` (default: EOS), and decoding stops
        as soon as every row has its end of text and nothing masked before it."""
        cfg = self.config
        if cfg.source != "masked" or cfg.mask_id is None:
            raise NotImplementedError("generate() samples masked-source models; sample this one with `tcsm sample DIR`")
        s = dict(cfg.sampling or {})
        run = dict(cfg.tcsm or {})
        path = dict((run.get("config") or {}).get("path") or {})
        steps = int(steps if steps is not None else s.get("steps") or 128)
        method = method if method is not None else s.get("method")
        method = "ancestral" if method in (None, "euler", "tau_leaping", "analytic", "cached", "ancestral") else method
        if method not in ("ancestral", "random", "confidence", "margin", "entropy", "threshold"):
            raise ValueError(f"generate() does not know the sampler {method!r}; use `tcsm sample DIR`")
        grid = grid or s.get("grid") or "uniform"
        temperature = float(temperature if temperature is not None else s.get("temperature", 1.0))
        top_p = float(top_p if top_p is not None else s.get("top_p", 1.0))
        final_argmax = bool(final_argmax if final_argmax is not None else s.get("final_argmax", False))
        own_blocks = bool((getattr(cfg, "denoiser", None) or {}).get("block_length"))
        # semi-autoregressive blocks of a full-sequence model (`block_length`: their name in exports before)
        block_length = semi_ar_block if semi_ar_block is not None else block_length
        saved = s.get("semi_ar_block", s.get("block_length"))
        block_length = block_length if block_length is not None or own_blocks else saved
        threshold = float(threshold if threshold is not None else s.get("threshold", 0.9))
        eos = eos_token_id if eos_token_id is not None else getattr(cfg, "eos_token_id", None)
        pad = pad_token_id if pad_token_id is not None else (getattr(cfg, "pad_token_id", None) if eos_token_id is None else None)
        pad = eos if pad is None else pad
        device = next(self.parameters()).device
        mask = int(cfg.mask_id)
        prompt = None if input_ids is None else torch.as_tensor(input_ids, device=device).long()
        if prompt is not None and prompt.dim() == 1:
            prompt = prompt[None]
        P = 0 if prompt is None else prompt.shape[1]
        B = prompt.shape[0] if prompt is not None else int(num_samples or 1)
        L = int(max_length or (P + max_new_tokens if max_new_tokens else 0) or (run.get("data_info") or {}).get("seq_len") or 0)
        if L <= P:
            raise ValueError(f"nothing to generate: the length {L} is not beyond the prompt's {P} tokens")
        x = torch.full((B, L), mask, dtype=torch.long, device=device)
        if prompt is not None:
            x[:, :P] = prompt
        k = int((getattr(cfg, "denoiser", None) or {}).get("block_length") or 0)
        if k:  # a block model: its own blocks, whole ones (L rounded up), `steps` per block, the prompt's pinned
            if block_length is not None and int(block_length) != k:
                raise ValueError(f"this block model decodes blocks of {k} positions; block_length={block_length} does not fit it")
            L = -(-L // k) * k
            x = torch.cat([x, torch.full((B, L - x.shape[1]), mask, dtype=torch.long, device=device)], 1)
            starts, block, per_block = list(range(P // k * k, L, k)), k, steps
        else:
            block = L - P if not block_length else int(block_length)
            starts = list(range(P, L, block))
            per_block = max(1, steps // len(starts))
        for b0 in starts:
            region = torch.zeros(L, dtype=torch.bool, device=device)
            region[b0 : min(b0 + block, L)] = True
            x = self._generate_block(x, region, per_block, method, grid, path, temperature, top_p, final_argmax,
                                     threshold, eos, P, generator)  # fmt: skip
            if self._ended(x, eos, P, mask):
                break
        return self._after_eos(x, eos, pad, P, mask)

    def _model_log_probs(self, x, t, temperature, top_p):
        timesteps = torch.full((x.shape[0],), float(t), device=x.device)
        extra = {}
        if (getattr(self.config, "denoiser", None) or {}).get("block_length"):
            # the block being drawn reads the finished blocks before it; what stands after it is never read
            extra["clean_ids"] = x.masked_fill(x == int(self.config.mask_id), 0)
        return _log_probs(self(input_ids=x, timesteps=timesteps, **extra).logits, temperature, top_p)

    def _generate_block(self, x, region, K, method, grid, path, temperature, top_p, final_argmax, threshold, eos, P,
                        generator):  # fmt: skip
        mask = int(self.config.mask_id)
        times = _grid(K, grid, x.device)
        alpha = _alpha(times, path)
        start = (x == mask) & region
        M = start.sum(-1)  # masked positions of each row in this region
        frac = ((alpha - alpha[0]) / (alpha[-1] - alpha[0]).clamp_min(1e-12)).clamp(0, 1)
        k = 0
        while True:
            masked = (x == mask) & region
            if not masked.any() or self._ended(x, eos, P, mask):
                return x
            if method != "threshold" and k >= K:
                return x
            t = float(times[min(k, K - 1)])
            lp = self._model_log_probs(x, t, temperature, top_p)
            last = method != "threshold" and k == K - 1
            drawn = lp.argmax(-1) if (final_argmax and last) else _draw(lp, generator)
            if method == "ancestral":
                a_t, a_s = alpha[k], alpha[k + 1]
                lam = 1.0 if last else float((a_s - a_t) / (1.0 - a_t).clamp_min(1e-12))
                u = torch.rand(x.shape, generator=generator, device=x.device)
                pick = masked & (u < lam)
            else:
                conf = lp.gather(-1, drawn[..., None]).squeeze(-1)
                if method == "margin":
                    top2 = lp.topk(2, dim=-1).values.exp()
                    score = top2[..., 0] - top2[..., 1]
                elif method == "entropy":
                    pr = lp.exp()
                    score = (pr * lp.clamp_min(-1e30)).sum(-1)  # −H: lower entropy first
                elif method == "random":
                    score = torch.rand(conf.shape, generator=generator, device=x.device, dtype=conf.dtype)
                else:
                    score = conf
                score = score + 1e-9 * torch.rand(score.shape, generator=generator, device=x.device, dtype=score.dtype)
                score = score.masked_fill(~masked, -torch.inf)
                if method == "threshold":
                    best = score.argmax(-1, keepdim=True)
                    pick = (conf.exp() > threshold) & masked
                    pick |= torch.zeros_like(pick).scatter(-1, best, True) & masked
                else:
                    n = (torch.round(M * frac[k + 1]) - torch.round(M * frac[k])).long()
                    n = torch.where(torch.full_like(n, last, dtype=torch.bool), masked.sum(-1), n)
                    order = score.argsort(-1, descending=True)
                    rank = torch.empty_like(order).scatter(-1, order, torch.arange(x.shape[1], device=x.device).expand_as(order))
                    pick = masked & (rank < n[:, None])
            x = torch.where(pick, drawn, x)
            k += 1
            if method == "threshold" and k > x.shape[1]:  # at least one position per step: a cap, never reached
                return x

    @staticmethod
    def _ended(x, eos, P, mask):
        """Every row has an end-of-text token after the prompt with nothing masked before it."""
        if eos is None:
            return False
        is_eos = x[:, P:] == eos
        if not is_eos.any(-1).all():
            return False
        first = is_eos.float().argmax(-1)
        before = torch.arange(x.shape[1] - P, device=x.device)[None] < first[:, None]
        return not bool(((x[:, P:] == mask) & before).any())

    @staticmethod
    def _after_eos(x, eos, pad, P, mask):
        if eos is None:
            return x
        tail = x[:, P:]
        is_eos = tail == eos
        seen = (is_eos.long().cumsum(-1) - is_eos.long()) > 0  # strictly after the first EOS
        tail = torch.where(seen, torch.full_like(tail, pad), tail)
        tail = torch.where(tail == mask, torch.full_like(tail, pad), tail)  # left masked only after an EOS
        return torch.cat([x[:, :P], tail], dim=1)


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


class TCSMForMaskedLM(DiffusionGenerationMixin, TCSMPreTrainedModel):
    """forward(input_ids = x_t, timesteps = t) → MaskedLMOutput(logits [B, L, V]); `labels` (clean ids, −100
    ignored) adds the cross-entropy of the clean tokens. A block model (`denoiser.block_length` = k) also takes
    clean_ids = x_1: the logits of block b read x_t^b, its time (timesteps [B, L], [B] or a scalar) and x_1^{<b}."""

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

    def forward(self, input_ids, timesteps=None, attention_mask=None, labels=None, return_dict=True, clean_ids=None,
                **kwargs):  # fmt: skip
        if self.c.get("block_length"):
            h = block_forward(self, input_ids, clean_ids, timesteps, attention_mask)
        else:
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


class TCSMHFDenoiserForMaskedLM(DiffusionGenerationMixin, TCSMPreTrainedModel):
    """A denoiser tcsm adapted from a pretrained Hugging Face masked or causal LM (`model.name=hf_denoiser`): the
    base architecture (`config.base_model`) under `hf`, our V tokens' HF ids (`token_ids`), a trainable [MASK]
    vector, and for a causal LM a BOS at position 0 whose outputs 0..L−1 give the logits of x^0..x^{L−1}, with
    bidirectional attention unless `denoiser.bidirectional` is false. forward(input_ids = x_t, timesteps = t); a block
    model from a causal LM (`denoiser.block_length` = k) also takes clean_ids = x_1 (`_block_logits`)."""

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

    def forward(self, input_ids, timesteps=None, return_dict=True, clean_ids=None, **kwargs):
        if self.config.denoiser.get("block_length"):
            logits = self._block_logits(input_ids, clean_ids, timesteps)
            return MaskedLMOutput(logits=logits) if return_dict else (logits,)
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

    def _block_logits(self, input_ids, clean_ids, timesteps):
        """A block model (`denoiser.block_length` = k) from a causal LM: logits [B, L, V] of every block b from x_t^b,
        its time and x_1^{<b} (clean_ids), in one pass over a clean stream [BOS, x_1] at positions 0..L and, per
        block, a noisy stream [x_1^{bk−1} (BOS for b = 0), x_t^b] at bk..bk+k whose outputs give the block's logits
        (the AR head's next-token shift); a noisy token sees its block and the clean keys before bk, a clean token
        the clean blocks up to its own (only earlier positions with `bidirectional` false)."""
        c, emb = self.config.denoiser, self.hf.get_input_embeddings()
        k, V = int(c["block_length"]), c["vocab_size"]
        check_block_inputs(input_ids, clean_ids, k)
        B, L = input_ids.shape
        nb, dev = L // k, input_ids.device
        bos = torch.full((B, 1), -1, dtype=torch.long, device=dev)
        anchors = torch.cat([bos, clean_ids[:, k - 1 : L - 1 : k]], 1)
        noisy = torch.cat([anchors[..., None], input_ids.view(B, nb, k)], -1).reshape(B, nb * (k + 1))
        x = torch.cat([noisy, bos, clean_ids], 1)
        h = emb(torch.where(x < 0, self.bos_id, self.token_ids[x.clamp(0, V - 1)]))
        if self.mask_embed is not None:
            h = torch.where((x >= V)[..., None], self.mask_embed.to(h.dtype), h)
        if self.time_embed is not None:
            if timesteps is None:
                raise ValueError("this model is time-conditioned: pass timesteps (t in [0, 1], t = 1 clean)")
            t = torch.as_tensor(timesteps, device=dev, dtype=torch.float32)
            t = t.reshape(B, L) if t.numel() == B * L and L > 1 else t.reshape(-1, 1).expand(B, L)
            t = torch.cat([torch.cat([t[:, ::k, None], t.view(B, nb, k)], -1).reshape(B, -1),
                           torch.ones(B, L + 1, device=dev)], 1)  # fmt: skip
            h = h + self.time_proj(self.time_embed(t.reshape(-1))).to(h.dtype).view(B, x.shape[1], -1)
        n = nb * (k + 1)
        pos = torch.cat([torch.arange(n, device=dev) - torch.arange(nb, device=dev).repeat_interleave(k + 1),
                         torch.arange(L + 1, device=dev)])  # fmt: skip
        block = torch.cat([torch.arange(nb, device=dev).repeat_interleave(k + 1),
                           (torch.arange(L + 1, device=dev) - 1).div(k, rounding_mode="floor")])  # fmt: skip
        is_noisy = torch.arange(pos.numel(), device=dev) < n
        qp, kp, qb, kb = pos[:, None], pos[None, :], block[:, None], block[None, :]
        qn, kn = is_noisy[:, None], is_noisy[None, :]
        both = bool(c.get("bidirectional", True))
        order = torch.ones_like(qp > kp) if both else kp <= qp
        allowed = (qn & ((kn & (kb == qb) & order) | (~kn & (kp < qb * k)))) | (
            ~qn & ~kn & ((kb <= qb) if both else (kp <= qp)))  # fmt: skip
        mask = torch.zeros(allowed.shape, dtype=h.dtype, device=dev).masked_fill(~allowed, torch.finfo(h.dtype).min)
        logits = self.hf(inputs_embeds=h, attention_mask=mask[None, None], position_ids=pos[None].expand(B, -1)).logits
        return logits[:, :n].view(B, nb, k + 1, -1)[:, :, :k].reshape(B, L, -1)[..., self.token_ids].float()
