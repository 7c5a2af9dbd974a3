"""A character-level tokenizer saved as a normal HF tokenizer (transformers and vLLM load it).

Vocabulary: 4 special tokens, "\\n" and the 95 printable ASCII characters, padded with unused
tokens to VOCAB_SIZE so every id the model can emit decodes. The chat template renders
``<bos>{user content}\\n``; the response follows and ends with ``<eos>``.
"""

from __future__ import annotations

import string
from pathlib import Path

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
VOCAB_SIZE = 128
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '\n' }}{% endif %}"
)


def vocabulary() -> list[str]:
    chars = ["\n"] + [c for c in string.printable if c.isprintable()]
    tokens = [PAD, BOS, EOS, UNK, *chars]
    tokens += [f"<extra_{i}>" for i in range(VOCAB_SIZE - len(tokens))]
    assert len(tokens) == VOCAB_SIZE and len(set(tokens)) == VOCAB_SIZE
    return tokens


def build_tokenizer(out_dir: str | Path):
    """Build and save the tokenizer into ``out_dir``; returns the PreTrainedTokenizerFast."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(vocabulary())}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))
    return fast
