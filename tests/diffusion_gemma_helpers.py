"""A tiny random DiffusionGemma from transformers' own config classes (nothing downloaded), for the model and
end-to-end tests."""

from __future__ import annotations

import torch


def tiny_hf(V=16, k=2, window=3, layers=("sliding_attention", "full_attention"), attn="sdpa", seed=0, scale=0.5):
    """A random DiffusionGemmaForBlockDiffusion with a few experts, a tiny vision tower and a sliding window
    shorter than the test sequences (so the sliding layers' truncated cache is exercised)."""
    import transformers as T

    text = T.DiffusionGemmaTextConfig(
        vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=len(layers), num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, global_head_dim=8, num_experts=3, top_k_experts=2,
        moe_intermediate_size=8, sliding_window=window, layer_types=list(layers), max_position_embeddings=64,
        pad_token_id=0, eos_token_id=1, bos_token_id=2, initializer_range=scale,
    )  # fmt: skip
    vision = T.Gemma4VisionConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=1,
                                  num_key_value_heads=1, head_dim=8)  # fmt: skip
    cfg = T.DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=k, image_token_id=V + 100,
                                 boi_token_id=V + 101, eoi_token_id=V + 102, initializer_range=scale)  # fmt: skip
    cfg._attn_implementation = attn
    with torch.random.fork_rng(devices=[]):  # the caller's random stream stays as it was
        torch.manual_seed(seed)
        return T.DiffusionGemmaForBlockDiffusion(cfg).eval()


#: the word vocabulary of `write_dgemma_dir`'s tokenizer, after <pad>, <eos>, <bos> (ids 0, 1, 2: the model's own)
WORDS = ["Once", "upon", "a", "time", "the", "day", "was", "good", "bad", "happy", "sad", "cat", "sat", "."]


def write_dgemma_dir(directory, seed: int = 0):
    """A tiny DiffusionGemma checkpoint directory as transformers writes one (config.json, model.safetensors,
    generation_config.json) with a word-level tokenizer whose special ids are the model's; returns the directory."""
    from pathlib import Path

    from llada_helpers import save_word_tokenizer

    directory = Path(directory)
    vocab = ["<pad>", "<eos>", "<bos>", *WORDS]
    tiny_hf(V=len(vocab), k=4, window=3, seed=seed).save_pretrained(directory)
    save_word_tokenizer(directory, vocab, "<pad>", {"pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>"})
    return directory
