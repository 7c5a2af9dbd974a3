"""The tiny causal LM: a transformers Llama, about 0.9M parameters, head_dim 32 (the smallest
head size vLLM's CPU attention accepts)."""

from __future__ import annotations

from dapo_async.tiny.tokenizer import VOCAB_SIZE

HIDDEN = 128
NUM_LAYERS = 4
NUM_HEADS = 4  # head_dim = 32
INTERMEDIATE = 384
MAX_POSITIONS = 256


def tiny_config(bos_id: int, eos_id: int, pad_id: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        torch_dtype="float32",
    )


def build_model(config, seed: int):
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(config)
