"""Readable rollouts (``samples.py``, ``sample_records.py``, ``tools/inspect_cmd.py``) on
hand-made groups: the per-step bound, the byte cap with rotation, what a record holds and how
``inspect`` chooses and marks records. The records of a real run: tests/launch/test_train.py."""

import json

import numpy as np
import pytest
import torch

from dapo_async.algo.losses import PolicyLossConfig, clip_marks, policy_loss
from dapo_async.protocol import Group
from dapo_async.sample_records import dropped_record, group_record, render, trained_record
from dapo_async.samples import SampleLog, read_samples, runs
from dapo_async.tools.inspect_cmd import examples_page, select


def _group(seq=0, rewards=(1.0, -1.0), finish=(0, 1), versions=((3, 3), (3, 4, 4))):
    lens = np.array([len(v) for v in versions], np.int32)
    n = int(lens.sum())
    return Group(
        generator_id="g0",
        seq=seq,
        prompt_id=7,
        prompt_tokens=np.array([1, 2, 3], np.int32),
        response_lens=lens,
        tokens=np.arange(10, 10 + n, dtype=np.int32),
        logprobs=np.zeros(n, np.float32),
        versions=np.concatenate([np.array(v, np.int32) for v in versions]),
        rewards=np.array(rewards, np.float32),
        acc=np.array([r > 0 for r in rewards], np.float32),
        components=np.array([[r, 0.0] for r in rewards], np.float32),
        finish=np.array(finish, np.uint8),
    )


def test_each_step_keeps_at_most_its_budget_per_key_and_old_steps_are_forgotten(tmp_path):
    log = SampleLog(tmp_path, "g", per_step=2)
    assert [log.take(5) for _ in range(3)] == [True, True, False]
    assert log.take(5, "stale") and log.take(6)  # another key, another step: their own budget
    for step in range(7, 30):
        log.take(step)
    assert len(log.taken) <= 8  # bounded memory however long the run
    assert not SampleLog(tmp_path, "off", per_step=0).take(0)


def test_the_file_is_rotated_at_half_the_cap_and_both_halves_are_read(tmp_path):
    log = SampleLog(tmp_path, "g", per_step=100, max_mb=0.01)  # ~10 KiB: half per file
    for i in range(200):
        log.write({"kind": "group", "step": i, "pad": "x" * 100})
    files = sorted(p.name for p in (tmp_path / "samples").iterdir())
    assert files == ["g.jsonl", "g.jsonl.1"]
    half = int(0.01 * (1 << 20)) // 2
    assert all(p.stat().st_size <= half for p in (tmp_path / "samples").iterdir())
    back = read_samples(tmp_path)
    steps = [r["step"] for r in back]
    assert steps == sorted(steps) and steps[-1] == 199 and 40 < len(back) < 200  # newest kept


def test_a_group_record_holds_the_text_rewards_finish_and_versions():
    rec = group_record(_group(), "1+2=", ["3", "4!"], ["correct", "overlong"])
    assert rec["step"] == 4 and rec["prompt"] == "1+2=" and rec["prompt_tokens"] == [1, 2, 3]
    r0, r1 = rec["responses"]
    assert (r0["text"], r0["reward"], r0["finish"], r0["versions"]) == ("3", 1.0, "stop", [[3, 2]])
    assert r1["finish"] == "length" and r1["versions"] == [[3, 1], [4, 2]]
    assert r1["tokens"] == [12, 13, 14] and r1["components"] == {"correct": -1.0, "overlong": 0.0}
    assert json.loads(json.dumps(rec)) == rec
    dropped = dropped_record(_group(), "filtered")
    assert dropped["kind"] == "dropped" and dropped["reason"] == "filtered"
    assert runs([5, 5, 6, 5]) == [[5, 2], [6, 1], [5, 1]]


def test_clip_marks_are_what_the_clip_fractions_count():
    cfg = PolicyLossConfig(clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    r = torch.tensor([[0.7, 1.5, 1.0, 0.7, 1.5, 5.0]])
    adv = torch.tensor([[-1.0, 1.0, 1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones_like(r)
    logp = torch.log(r)
    tap = {}
    _, m = policy_loss(logp, torch.zeros_like(r), torch.zeros_like(r), adv, mask, cfg, tap=tap)
    # low (A<0, r<0.8), high (A>0, r>1.28), free, free (A>0), free (A<0, r high), dual (A<0, r·A
    # beyond 3|A|)
    assert tap["clip_BT"].tolist() == [[1, 2, 0, 0, 0, 3]]
    assert m["pg_clip_frac_low"] == pytest.approx(1 / 6)
    assert m["pg_clip_frac_high"] == pytest.approx(1 / 6)
    assert m["dual_clip_frac"] == pytest.approx(1 / 6)
    dual = torch.zeros_like(r, dtype=torch.bool)
    assert clip_marks(r, adv, dual, cfg).tolist() == [[1, 2, 0, 0, 0, 0]]


def _trained(step, clip):
    n = len(clip)
    row = dict(
        prompt=[1], tokens=list(range(n)), adv=0.5, reward=1.0, acc=1.0, truncated=False,
        versions=[step - 1] * n, ratio=[1.0] * n, is_weight=[1.0] * n, clip=clip, kept=[1] * n,
    )  # fmt: skip
    return {"role": "learner", **trained_record(step, row)}


def test_inspect_picks_worst_best_truncated_clipped_and_dropped_by_step():
    recs = [
        {"role": "g0", **group_record(_group(0, (1.0, 1.0), (0, 0)), "a", [], [])},
        {"role": "g0", **group_record(_group(1, (-1.0, -1.0), (0, 1)), "b", [], [])},
        {"role": "g0", **group_record(_group(2, (1.0, -1.0), (1, 1), ((1,), (1,))), "c", [], [])},
        _trained(4, [0, 0, 0]),
        _trained(4, [0, 2, 1]),
        _trained(5, [1, 0, 0]),
        {"role": "buffer", **dropped_record(_group(3), "stale")},
    ]
    assert [r["seq"] for r in select(recs, "worst", None, 3)] == [1, 2, 0]
    assert [r["seq"] for r in select(recs, "best", None, 1)] == [0]
    assert [r["seq"] for r in select(recs, "truncated", None, 5)] == [2, 1]  # most cut first
    assert [r["seq"] for r in select(recs, "truncated", 1, 5)] == [2]  # step 1: versions (1,)
    clipped = select(recs, "clipped", None, 5)
    assert [(r["step"], sum(map(bool, r["clip"]))) for r in clipped] == [(4, 2), (5, 1)]
    assert [r["reason"] for r in select(recs, "dropped", None, 5)] == ["stale"]
    text = render(clipped[0], decode=None)
    assert "2 clipped token(s)" in text and "⟦1⟧↑" in text and "⟦2⟧↓" in text
    assert "\x1b[33m1\x1b[0m" in render(clipped[0], decode=None, colour=True)


def test_inspect_and_the_report_page_on_a_written_run(tmp_path, capsys):
    from dapo_async.cli import main

    log = SampleLog(tmp_path, "g0", per_step=5)
    log.write(group_record(_group(0, (-1.0, -1.0)), "1+2=", ["5", "6"], []))
    log.write(trained_record(1, {
        "prompt": [1], "tokens": [4, 5], "adv": -1.0, "reward": -1.0, "acc": 0.0,
        "truncated": False, "versions": [0, 0], "ratio": [1.0, 0.5], "is_weight": [1.0, 1.0],
        "clip": [0, 1], "kept": [1, 1]}))  # fmt: skip
    assert main(["inspect", str(tmp_path), "--worst", "--n", "1"]) == 0
    out = capsys.readouterr().out
    assert "prompt: 1+2=" in out and "reward -1.000" in out and "      5" in out
    assert main(["inspect", str(tmp_path), "--clipped", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert len(got) == 1 and got[0]["clip"] == [0, 1]
    page = examples_page(tmp_path)
    assert "## Trained responses with clipped tokens" in page and "⟦5⟧↓" in page
    assert main(["inspect", str(tmp_path / "nowhere")]) == 1
    assert "no recorded rollouts" in capsys.readouterr().err
