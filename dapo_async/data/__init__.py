"""Prompt data: built-in synthetic tasks, DAPO-schema parquet/JSONL loading, prompt encoding
with the tokenizer's chat template (no torch), and the resumable shuffled cursor."""
