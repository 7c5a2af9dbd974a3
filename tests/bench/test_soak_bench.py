"""`bench soak` end to end, briefly: a real buffer process under 16 fake generators, 2 learner
ranks and 3 hostile peers; its books balance, nothing is trained twice, and the hostile
peers' messages are refused and counted."""

import json
import subprocess
import sys


def test_soak_books_balance_and_hostile_peers_are_refused(repo, cli_env):
    out = subprocess.run(
        [sys.executable, "-m", "dapo_async.cli", "bench", "soak", "--minutes", "0.25", "--json"],
        capture_output=True, text=True, cwd=repo, env=cli_env, timeout=240,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["peer_errors"] == [] and r["books_balance"] and r["trained_twice"] == 0
    assert r["acked_stored"] == r["produced"] > 0 and r["steps"] >= 2
    assert r["ack_statuses"].get("duplicate", 0) == 0
    refused = r["hostile_refused"]
    assert refused["malformed"]["impersonation"] > 0 and refused["malformed"]["bad_header"] > 0
    assert refused["rejected"]["group_size"] > 0
    assert r["ack_latency_ms"]["p50"] is not None and r["rss_mb"][0] > 0
    assert "soak" in out.stderr and "books balance" in out.stderr
