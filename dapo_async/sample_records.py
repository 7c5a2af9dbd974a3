"""The records of ``samples.py`` built from what each role holds, and their readable text (the
same text goes to Aim and to ``dapo-async inspect``). Pure: numpy in, dicts and strings out.

A record's ``step`` is the policy version that sampled it for the generator's and the buffer's
records (= the learner step that made those weights) and the learner's step for what it trained.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dapo_async.protocol import FINISH_REASONS
from dapo_async.samples import runs

FINISH_NAMES = {code: name for name, code in FINISH_REASONS.items()}
# Ratios and weights are kept to this many decimals (readability and file size).
DECIMALS = 3


def group_record(group, prompt_text: str, texts: list[str], component_names: list[str]) -> dict:
    """The generator's record of one scored group (module docstring)."""
    ends = np.cumsum(group.response_lens)
    starts = ends - group.response_lens
    responses = []
    for i, (a, b) in enumerate(zip(starts, ends)):
        responses.append(
            {
                "text": texts[i] if i < len(texts) else "",
                "tokens": group.tokens[a:b].tolist(),
                "reward": float(group.rewards[i]),
                "acc": float(group.acc[i]),
                "components": dict(zip(component_names, map(float, group.components[i]))),
                "len": int(group.response_lens[i]),
                "finish": FINISH_NAMES.get(int(group.finish[i]), "?"),
                "versions": runs(group.versions[a:b]),
            }
        )
    return {
        "kind": "group",
        "step": newest_version(group),
        "generator": group.generator_id,
        "seq": int(group.seq),
        "prompt_id": int(group.prompt_id),
        "prompt": prompt_text,
        "prompt_tokens": group.prompt_tokens.tolist(),
        "responses": responses,
    }


def dropped_record(group, reason: str) -> dict:
    """The buffer's record of a group it refused or filtered out, and why."""
    rec = group_record(group, "", [], [])
    rec.update(kind="dropped", reason=reason)
    return rec


def trained_record(step: int, row: dict) -> dict:
    """The learner's record of one trained response: ``row`` holds its tokens, advantage,
    reward, accuracy, truncation, versions and per-token ``ratio``, ``is_weight``, ``clip``
    (codes of ``samples.CLIP_MARKS``) and ``kept`` (0 where a token/sequence mask dropped it)."""
    return {
        "kind": "trained",
        "step": int(step),
        "prompt_tokens": [int(t) for t in row["prompt"]],
        "tokens": [int(t) for t in row["tokens"]],
        "adv": round(float(row["adv"]), DECIMALS + 1),
        "reward": float(row["reward"]),
        "acc": float(row["acc"]),
        "truncated": bool(row["truncated"]),
        "versions": runs(row["versions"]),
        "ratio": np.round(np.asarray(row["ratio"], dtype=np.float64), DECIMALS).tolist(),
        "is_weight": np.round(np.asarray(row["is_weight"], dtype=np.float64), DECIMALS).tolist(),
        "clip": [int(c) for c in row["clip"]],
        "kept": [int(k) for k in row["kept"]],
    }


def newest_version(group) -> int:
    return int(group.versions.max()) if group.versions.size else -1


def render(record: dict, decode=None, colour: bool = False) -> str:
    """A record as text: ``decode`` (token ids → text) shows tokens as text where the record
    holds ids only; ``colour`` marks clipped tokens with ANSI colours (else with brackets)."""
    kind = record["kind"]
    if kind == "trained":
        return _render_trained(record, decode, colour)
    what = f"dropped ({record['reason']})" if kind == "dropped" else "sampled"
    head = f"[{record['role']} step {record['step']}] {what} group {record['generator']}#{record['seq']}"
    prompt = record.get("prompt") or _decode(decode, record.get("prompt_tokens", []))
    lines = [head, f"prompt: {prompt.strip()}"]
    for i, r in enumerate(record["responses"]):
        text = r.get("text") or _decode(decode, r["tokens"])
        parts = " ".join(f"{k}={v:.3g}" for k, v in r.get("components", {}).items())
        versions = ",".join(f"v{v}×{n}" for v, n in r["versions"])
        lines.append(
            f"  [{i}] reward {r['reward']:.3f} acc {r['acc']:.0f} len {r['len']} "
            f"{r['finish']} {versions} {parts}".rstrip()
        )
        lines.append(f"      {text}")
    return "\n".join(lines)


def _render_trained(record: dict, decode, colour: bool) -> str:
    n_clip = sum(1 for c in record["clip"] if c)
    head = (
        f"[{record['role']} step {record['step']}] trained: adv {record['adv']:+.3f} reward "
        f"{record['reward']:.3f} acc {record['acc']:.0f} len {len(record['tokens'])}"
        f"{' truncated' if record['truncated'] else ''}, {n_clip} clipped token(s), "
        f"importance weight max {max(record['is_weight'], default=1.0):.3f}"
    )
    pieces = []
    for tok, clip, kept in zip(record["tokens"], record["clip"], record["kept"]):
        s = _decode(decode, [tok]) if decode else str(tok)
        if clip:
            s = (
                f"\x1b[{31 if clip == 1 else 33}m{s}\x1b[0m"
                if colour
                else f"⟦{s}⟧{'↓↑‖'[clip - 1]}"
            )
        if not kept:
            s = f"\x1b[2m{s}\x1b[0m" if colour else f"~{s}~"
        pieces.append(s)
    legend = "⟦t⟧↓ clipped low, ⟦t⟧↑ clipped high, ⟦t⟧‖ dual-clip, ~t~ masked"
    prompt = _decode(decode, record["prompt_tokens"]) if decode else ""
    body = ("" if decode else " ").join(pieces)
    return "\n".join([head, f"prompt: {prompt}" if prompt else "", body, f"({legend})"]).replace(
        "\n\n", "\n"
    )


def token_decoder(model_dir: str):
    """``decode(ids) -> text`` of the model's ``tokenizer.json`` through the ``tokenizers``
    library (no torch: the buffer and ``inspect`` use it), or None where there is none."""
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(path))
    except Exception:
        return None
    return lambda ids: tok.decode(list(ids), skip_special_tokens=False)


def _decode(decode, ids) -> str:
    if decode is None:
        return " ".join(map(str, ids))
    try:
        return decode(list(ids))
    except Exception:
        return " ".join(map(str, ids))
