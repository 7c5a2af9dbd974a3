"""`bench faults`' bookkeeping without its runs: each kill's step gaps are attributed to the
phase it was made in (until the next kill), the summary names what ran, and --only refuses an
unknown scenario."""

import argparse
import json

import pytest

from dapo_async.bench import faults_bench as fb


def test_gaps_are_attributed_to_the_phase_of_the_kill_before_them(tmp_path):
    (tmp_path / "metrics").mkdir()
    times = [0, 1, 2, 12, 13, 14, 17, 18, 19, 20]  # gaps: 10 after t=5, 3 after t=15
    lines = [
        json.dumps({"time": t, "step": i, "time/wait_data_s": 0.1}) for i, t in enumerate(times)
    ]
    (tmp_path / "metrics" / "learner.jsonl").write_text("\n".join(lines) + "\n")
    got = fb._phase_gaps(tmp_path, [("between", 5.0), ("formation", 15.0), ("between", 18.5)])
    assert got["max_gap_s"] == {"between": 10.0, "formation": 3.0}
    assert got["median_step_s"] == 1.0
    out = {"wsync_max_gap_s": got["max_gap_s"], "wsync_median_step_s": 1.0, "wsync_finished": True}
    assert "formation 3.0s" in fb._summary(out) and "buffer" not in fb._summary(out)


def test_only_refuses_an_unknown_scenario(tmp_path):
    args = argparse.Namespace(only="wsync,bogus", overrides=[], config="configs/tiny_cpu.yaml")
    with pytest.raises(SystemExit, match="bogus"):
        fb._scenarios(args, tmp_path)
