"""One prompt path for training and evaluation: the tokenizer's own chat template (rendered by
transformers, in a child process for the buffer), a system prompt, template variables, and raw
prompts for base models. The two templates a hand-written Jinja renderer got wrong — a
date-aware one and one using ``{% break %}`` — render the same in training and evaluation."""

import json
import shutil
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from dapo_async.config import load_config
from dapo_async.data.prompts import PromptRenderer, encode_in_child

DATE_AWARE = (
    "{{ bos_token }}Today is {{ strftime_now('%Y') }}.\n"
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
WITH_BREAK = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'stop' %}{% break %}{% endif %}"
    "[{{ m['role'] }}]{{ m['content'] }}{% if mode is defined %}<{{ mode }}>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
)
MSGS = [{"role": "user", "content": "1+2="}, {"role": "stop", "content": "x"}]


def _model_with_template(tiny_model, tmp_path, template: str):
    d = tmp_path / "tok"
    shutil.copytree(tiny_model, d)
    (d / "chat_template.jinja").write_text(template)
    cfg_path = d / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("chat_template", None)
    cfg_path.write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("template", [DATE_AWARE, WITH_BREAK], ids=["date-aware", "break"])
def test_training_and_evaluation_render_the_same_prompt(tiny_model, tmp_path, template):
    d = _model_with_template(tiny_model, tmp_path, template)
    data = load_config(None, ["data.system_prompt=Be brief."]).data
    tok = AutoTokenizer.from_pretrained(str(d))
    renderer = PromptRenderer.from_config(tok, data)  # the evaluation path
    text = renderer.render(MSGS)
    assert text.startswith(tok.bos_token) and "Be brief." in text
    if template is WITH_BREAK:
        assert "[stop]" not in text  # {% break %} worked
    # the buffer's path: a child process, then the run directory's cache
    ids = encode_in_child(str(d), data, [MSGS], tmp_path)
    assert ids == [renderer.encode(MSGS)]
    assert list(tmp_path.glob("prompt-tokens-*.json"))
    assert encode_in_child(str(d), data, [MSGS], tmp_path) == ids  # from the cache


def test_template_kwargs_and_raw_prompts(tiny_model, tmp_path):
    d = _model_with_template(tiny_model, tmp_path, WITH_BREAK)
    tok = AutoTokenizer.from_pretrained(str(d))
    chat = PromptRenderer(tok, template_kwargs={"mode": "fast"})
    assert "<fast>" in chat.render(MSGS[:1])
    raw = PromptRenderer(tok, system_prompt="S", fmt="raw")
    assert raw.render(MSGS[:1]) == "S\n\n1+2="
    assert raw.encode(MSGS[:1]) == tok("S\n\n1+2=").input_ids  # with the special tokens
    with pytest.raises(ValueError, match="prompt_format"):
        PromptRenderer(tok, fmt="markdown")


def test_a_template_error_is_one_clear_line(tiny_model, tmp_path):
    d = _model_with_template(tiny_model, tmp_path, "{{ raise_exception('no system role') }}")
    data = SimpleNamespace(prompt_format="chat", system_prompt="", chat_template_kwargs={})
    with pytest.raises(ValueError, match="no system role"):
        encode_in_child(str(d), data, [MSGS], None)
