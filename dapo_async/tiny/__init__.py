"""The built-in tiny policy: a character-level tokenizer, a small Llama, and its warm start."""
