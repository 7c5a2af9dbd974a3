"""Prompt datasets: DAPO-Math-17K-schema parquet and JSONL files, and the built-in tasks.

Schema (one row per prompt): ``data_source`` (str), ``prompt`` (list of {role, content}),
``ability`` (str), ``reward_model`` ({ground_truth, style}), ``extra_info`` ({index, ...}).
Eval files may repeat each prompt k times (avg@k); ``group_repeats`` folds them.
How a record becomes token ids is ``data/prompts.py``'s (one path for training and evaluation).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dapo_async.data.tasks import PromptRecord, generate, parse_source

if TYPE_CHECKING:
    from dapo_async.config import DataConfig


class DataError(ValueError):
    """A data file is missing, unreadable, or a row does not follow the schema."""


def _row_to_record(row: dict[str, Any], i: int, where: str) -> PromptRecord:
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in prompt)
    ):
        raise DataError(f"{where} row {i}: 'prompt' must be a list of {{role, content}} messages")
    rm = row.get("reward_model") or {}
    truth = rm.get("ground_truth") if isinstance(rm, dict) else None
    if truth is None:
        raise DataError(f"{where} row {i}: missing reward_model.ground_truth")
    extra = row.get("extra_info") or {}
    return PromptRecord(
        prompt_id=i,
        messages=[{"role": str(m.get("role", "user")), "content": m["content"]} for m in prompt],
        ground_truth=str(truth),
        data_source=str(row.get("data_source", "")),
        extra=dict(extra) if isinstance(extra, dict) else {},
    )


def load_file(path: str | Path) -> list[PromptRecord]:
    p = Path(path)
    if not p.is_file():
        raise DataError(f"data file not found: {p}")
    if p.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq

            rows = pq.read_table(p).to_pylist()
        except Exception as e:
            raise DataError(f"cannot read parquet {p}: {e}") from None
    elif p.suffix in (".jsonl", ".json"):
        rows = []
        for n, line in enumerate(p.read_text().splitlines()):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise DataError(f"{p} line {n + 1}: not JSON ({e})") from None
    else:
        raise DataError(f"unsupported data file {p}: use .parquet or .jsonl")
    return [_row_to_record(r, i, str(p)) for i, r in enumerate(rows)]


def load_source(
    source: str, split: str, num: int, difficulty: int, seed: int, max_difficulty: int = 0
) -> list[PromptRecord]:
    """Records of ``tiny:<task>`` (generated; difficulty in [difficulty, max_difficulty] when
    the latter is larger) or of a parquet/JSONL file."""
    family = parse_source(source)
    if family is not None:
        return generate(family, split, num, difficulty, seed, max_difficulty)
    return load_file(source)


def load_heldout(data: DataConfig, run_seed: int) -> list[PromptRecord]:
    """A run's held-out records: ``data.eval_source``, else the held-out split of
    ``data.source``; a built-in task's sample is drawn with ``data.eval_seed`` (-1: the run's)."""
    seed = run_seed if data.eval_seed < 0 else data.eval_seed
    source = data.eval_source or data.source
    return load_source(source, "eval", data.num_eval, data.difficulty, seed, data.max_difficulty)


def group_repeats(records: list[PromptRecord]) -> list[tuple[PromptRecord, int]]:
    """Fold identical (prompt, ground truth) rows: (record, repeat count), first-seen order."""
    seen: dict[tuple, int] = {}
    out: list[list] = []
    for r in records:
        key = (json.dumps(r.messages, sort_keys=True), r.ground_truth)
        if key in seen:
            out[seen[key]][1] += 1
        else:
            seen[key] = len(out)
            out.append([r, 1])
    return [(r, k) for r, k in out]
