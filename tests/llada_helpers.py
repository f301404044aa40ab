"""A tiny masked diffusion LM directory as LLaDA and Dream ship theirs: `trust_remote_code` modeling files
(bidirectional Llama-like blocks, `forward(input_ids) → logits`, no time input), `mask_token_id` in config.json, and
a word-level tokenizer whose vocabulary holds the mask token (as LLaDA's holds <|mdm_mask|>). Written by the tests
themselves: nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import torch

CONFIGURATION = '''
from transformers import PretrainedConfig


class TinyDLMConfig(PretrainedConfig):
    model_type = "tiny_dlm"

    def __init__(self, vocab_size=16, hidden_size=32, num_layers=2, num_heads=2, max_position_embeddings=64,
                 mask_token_id=15, shift_logits=False, **kwargs):
        self.vocab_size, self.hidden_size, self.num_layers = vocab_size, hidden_size, num_layers
        self.num_heads, self.max_position_embeddings = num_heads, max_position_embeddings
        self.mask_token_id, self.shift_logits = mask_token_id, shift_logits
        super().__init__(**kwargs)
'''

MODELING = '''
import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import MaskedLMOutput

from .configuration_tiny_dlm import TinyDLMConfig


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c.hidden_size
        self.h = c.num_heads
        self.attn_norm, self.ff_norm = RMSNorm(d), RMSNorm(d)
        self.q_proj, self.k_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.v_proj, self.attn_out = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.ff_proj, self.up_proj = nn.Linear(d, 2 * d, bias=False), nn.Linear(d, 2 * d, bias=False)
        self.ff_out = nn.Linear(2 * d, d, bias=False)

    def forward(self, x):
        B, L, D = x.shape
        a = self.attn_norm(x)
        q, k, v = (p(a).view(B, L, self.h, D // self.h).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=False)  # bidirectional
        x = x + self.attn_out(y.transpose(1, 2).reshape(B, L, D))
        f = self.ff_norm(x)
        return x + self.ff_out(nn.functional.silu(self.ff_proj(f)) * self.up_proj(f))


class TinyDLMModel(PreTrainedModel):
    config_class = TinyDLMConfig
    base_model_prefix = "model"

    def __init__(self, config):
        super().__init__(config)
        self.wte = nn.Embedding(config.vocab_size, config.hidden_size)
        self.wpe = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.ln_f = RMSNorm(config.hidden_size)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.2)

    def get_input_embeddings(self):
        return self.wte

    def forward(self, input_ids, attention_mask=None, **kwargs):
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.wte(input_ids) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return MaskedLMOutput(logits=self.lm_head(self.ln_f(x)))
'''

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "a", "cat", "sat", "on", "mat"]
SPECIALS = ["<|eot|>", "<|mdm_mask|>"]


def save_word_tokenizer(directory: Path, vocab: list[str], unk: str, specials: dict) -> None:
    """A word-level tokenizer of `vocab` (ids in list order, whitespace-split) as tokenizer.json, and a
    tokenizer_config.json naming its special tokens (`specials`: {"eos_token": ..., ...})."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(Path(directory) / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **specials}
    (Path(directory) / "tokenizer_config.json").write_text(json.dumps(config))


def write_tokenizer(directory: Path) -> list[str]:
    """A word-level tokenizer (tokenizers file): the words, end of text, then the mask token (inside the vocabulary,
    as LLaDA's <|mdm_mask|>); returns the vocabulary in id order."""
    vocab = WORDS + SPECIALS
    save_word_tokenizer(directory, vocab, "<|eot|>",
                        {"eos_token": "<|eot|>", "pad_token": "<|eot|>", "mask_token": "<|mdm_mask|>"})  # fmt: skip
    return vocab


def write_masked_dlm(directory: Path, *, shift_logits: bool = False, seed: int = 0, hidden: int = 32,
                     layers: int = 2, tokenizer: bool = True) -> Path:
    """A tiny random masked diffusion LM directory (modeling files, config.json with auto_map and mask_token_id,
    safetensors weights, a tokenizer); the mask id is the tokenizer's <|mdm_mask|>, inside the vocabulary."""
    import transformers as tf

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "configuration_tiny_dlm.py").write_text(CONFIGURATION)
    (directory / "modeling_tiny_dlm.py").write_text(MODELING)
    V = len(WORDS) + len(SPECIALS)
    config = {
        "model_type": "tiny_dlm", "architectures": ["TinyDLMModel"], "vocab_size": V, "hidden_size": hidden,
        "num_layers": layers, "num_heads": 2, "max_position_embeddings": 64, "mask_token_id": V - 1,
        "eos_token_id": V - 2, "shift_logits": shift_logits,
        "auto_map": {"AutoConfig": "configuration_tiny_dlm.TinyDLMConfig", "AutoModel": "modeling_tiny_dlm.TinyDLMModel"},
    }  # fmt: skip
    (directory / "config.json").write_text(json.dumps(config))
    cfg = tf.AutoConfig.from_pretrained(str(directory), trust_remote_code=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = tf.AutoModel.from_config(cfg, trust_remote_code=True)
    model.save_pretrained(str(directory))
    if tokenizer:
        write_tokenizer(directory)
    return directory
