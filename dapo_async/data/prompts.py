"""The one prompt path: how a record's messages become the token ids a policy sees, for training
(the buffer encodes the prompts it leases), generation and evaluation alike.

    messages = [system prompt (data.system_prompt, unless the record has one)] + record.messages
    chat (data.prompt_format=chat):  the tokenizer's own ``apply_chat_template(messages,
        add_generation_prompt=True, **data.chat_template_kwargs)``, tokenized without adding
        special tokens again (the template places them)
    raw  (data.prompt_format=raw):   the message contents joined by blank lines, tokenized with
        the tokenizer's special tokens (a base model's BOS) — no template

transformers renders the template (its Jinja environment: loop controls, ``strftime_now``,
``raise_exception``), so training and evaluation cannot disagree on a prompt.
"""

from __future__ import annotations

from pathlib import Path


class PromptRenderer:
    def __init__(self, tokenizer, system_prompt: str = "", template_kwargs=None, fmt="chat"):
        if fmt not in ("chat", "raw"):
            raise ValueError(f"data.prompt_format must be chat or raw, got {fmt!r}")
        if fmt == "chat" and not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "data.prompt_format=chat: the tokenizer has no chat template (use "
                "data.prompt_format=raw for a base model)"
            )
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.template_kwargs = dict(template_kwargs or {})
        self.fmt = fmt

    @classmethod
    def for_model(cls, model_dir: str | Path, data_cfg) -> PromptRenderer:
        """The renderer of ``data_cfg`` over the tokenizer in ``model_dir``."""
        from transformers import AutoTokenizer

        return cls.from_config(AutoTokenizer.from_pretrained(str(model_dir)), data_cfg)

    @classmethod
    def from_config(cls, tokenizer, data_cfg) -> PromptRenderer:
        return cls(
            tokenizer,
            data_cfg.system_prompt,
            data_cfg.chat_template_kwargs,
            data_cfg.prompt_format,
        )

    def messages(self, messages: list[dict[str, str]]) -> list[dict[str, str]]:
        if self.system_prompt and not any(m.get("role") == "system" for m in messages):
            return [{"role": "system", "content": self.system_prompt}, *messages]
        return list(messages)

    def render(self, messages: list[dict[str, str]]) -> str:
        msgs = self.messages(messages)
        if self.fmt == "raw":
            return "\n\n".join(m["content"] for m in msgs)
        return self.tokenizer.apply_chat_template(
            msgs, add_generation_prompt=True, tokenize=False, **self.template_kwargs
        )

    def encode(self, messages: list[dict[str, str]]) -> list[int]:
        return self.tokenize(self.render(messages))

    def tokenize(self, text: str) -> list[int]:
        """Token ids of a prompt ``render`` made (special tokens added only for raw prompts:
        a chat template places its own)."""
        return self.tokenizer(text, add_special_tokens=self.fmt == "raw").input_ids


# ----------------------------------------------------------------------------------------------
# Encoding in a child process: the buffer must not import torch (transformers does), so it
# has its prompts encoded by ``python -m dapo_async.data.prompts`` and caches the result in the
# run directory (a restarted buffer reads the cache).

# A child that renders a few thousand prompts takes seconds; this bounds a wedged one.
ENCODE_TIMEOUT_S = 600.0


def _cache_key(model_dir: str, data_cfg, all_messages: list) -> str:
    import hashlib
    import json

    h = hashlib.sha256()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        f = Path(model_dir) / name
        h.update(f.read_bytes() if f.is_file() else b"-")
    spec = [data_cfg.prompt_format, data_cfg.system_prompt, data_cfg.chat_template_kwargs]
    h.update(json.dumps([spec, all_messages], sort_keys=True).encode())
    return h.hexdigest()[:16]


def encode_in_child(model_dir: str, data_cfg, all_messages: list, cache_dir: Path | None):
    """Token ids of every prompt, rendered by ``PromptRenderer`` in a child process (or read
    from ``cache_dir``)."""
    import json
    import subprocess
    import sys

    cache = None
    if cache_dir is not None:
        cache = (
            Path(cache_dir) / f"prompt-tokens-{_cache_key(model_dir, data_cfg, all_messages)}.json"
        )
        if cache.is_file():
            return json.loads(cache.read_text())
    fields = ("prompt_format", "system_prompt", "chat_template_kwargs")
    data = {k: getattr(data_cfg, k) for k in fields}
    job = {"model_dir": str(model_dir), "data": data, "messages": all_messages}
    res = subprocess.run(
        [sys.executable, "-m", __name__],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=ENCODE_TIMEOUT_S,
        check=False,
    )
    if res.returncode != 0:
        tail = res.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise ValueError(f"cannot render the prompts with {model_dir}'s tokenizer: {tail[0]}")
    ids = json.loads(res.stdout)
    if cache is not None:
        from dapo_async.utils import atomic_write_text

        atomic_write_text(cache, json.dumps(ids))
    return ids


def _child_main() -> None:
    import json
    import sys
    from types import SimpleNamespace

    job = json.loads(sys.stdin.read())
    renderer = PromptRenderer.for_model(job["model_dir"], SimpleNamespace(**job["data"]))
    json.dump([renderer.encode(m) for m in job["messages"]], sys.stdout)


if __name__ == "__main__":
    _child_main()
