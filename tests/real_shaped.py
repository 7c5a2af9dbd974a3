"""A real-shaped model built at test time, nothing downloaded: a Qwen2-architecture causal LM
with random weights and a byte-level BPE tokenizer trained here with `tokenizers`, with Qwen's
special tokens (<|im_start|>, <|im_end|> as EOS, <|endoftext|> as padding) and a Qwen-style chat
template that adds a default system prompt — what a character tokenizer never exercises:
multi-byte characters, special tokens, an EOS that is not the padding token."""

from __future__ import annotations

import json
import random
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = (
    "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MULTIBYTE = "Réponse 答案 🙂 naïve café"


def build_qwen2_like(d: Path, seed: int = 0) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [f"{a}+{b}={a + b}; Answer: {a + b}\n" for a in range(30) for b in range(30)]
    corpus += [MULTIBYTE + "\n"] * 20
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=TEMPLATE,
    )
    fast.save_pretrained(d)
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=tok.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 32: the smallest vLLM's CPU attention takes
        num_key_value_heads=1,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
    )
    Qwen2ForCausalLM(cfg).save_pretrained(d)
    return d


def write_jsonl(path: Path, n: int = 64) -> Path:
    """Arithmetic prompts with multi-byte text, DAPO-Math schema."""
    rng = random.Random(0)
    rows = []
    for i in range(n):
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        rows.append(
            {
                "data_source": "real_shaped",
                "prompt": [{"role": "user", "content": f"{a}+{b}= ({MULTIBYTE})"}],
                "reward_model": {"ground_truth": str(a + b)},
                "extra_info": {"index": i},
            }
        )
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path
