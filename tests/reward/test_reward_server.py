import http.server
import json
import signal
import subprocess
import sys
import threading

import pytest

from dapo_async.reward.http_client import HTTPRewardClient, RewardHTTPError


def test_reward_server_process_matches_in_process(reward_model_dir, cli_env, repo):
    from dapo_async.reward.server import RewardClient, RewardModel

    texts = ["12+3=\nAnswer: 15", "Answer: 7", "a much longer response " * 5, "x"]
    expected = RewardModel(str(reward_model_dir)).score(texts)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dapo_async.cli", "reward-server", "--model", str(reward_model_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=repo,
        env=cli_env,
    )
    try:
        line = proc.stdout.readline()
        assert "listening on tcp://127.0.0.1:" in line, (
            proc.stderr.read() if proc.poll() is not None else line
        )
        endpoint = line.split("listening on ")[1].strip()
        client = RewardClient(endpoint, timeout_s=60)
        got = client.score(texts)
        got2 = client.score(texts[:2])  # a second request on the same connection
        client.close()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    assert got == pytest.approx(expected, abs=1e-5)
    assert got2 == pytest.approx(expected[:2], abs=1e-5)
    assert proc.returncode == 0


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        texts = body["texts"]
        if texts == ["boom"]:
            self.send_response(500)
            self.end_headers()
            return
        scores = [float("nan")] if texts == ["nan"] else [float(len(t)) for t in texts]
        out = json.dumps({"scores": scores}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


def test_http_reward_client_against_local_server():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        client = HTTPRewardClient(f"http://127.0.0.1:{server.server_port}/score", timeout_s=5)
        assert client.score(["ab", "abcd"]) == [2.0, 4.0]
        with pytest.raises(RewardHTTPError, match="HTTP 500"):
            client.score(["boom"])
        with pytest.raises(RewardHTTPError, match=r"non-finite|JSON"):
            client.score(["nan"])
    finally:
        server.shutdown()
    with pytest.raises(RewardHTTPError, match="unreachable"):
        HTTPRewardClient(f"http://127.0.0.1:{server.server_port}/score", timeout_s=1).score(["a"])
    with pytest.raises(ValueError):
        HTTPRewardClient("ftp://x")


def test_reward_score_cli(cli_env, repo):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dapo_async.cli",
            "reward",
            "score",
            "--fn",
            "dapo_math",
            "--ground-truth",
            "42",
        ],
        input="work...\nAnswer: 42\n",
        capture_output=True,
        text=True,
        cwd=repo,
        env=cli_env,
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["score"] == 1.0 and res["acc"] == 1.0 and res["pred"] == "42"
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "dapo_async.cli",
            "reward",
            "score",
            "--fn",
            "nope",
            "--ground-truth",
            "1",
        ],
        input="x",
        capture_output=True,
        text=True,
        cwd=repo,
        env={**cli_env, "PYTHONWARNINGS": "ignore"},
    )
    assert bad.returncode == 1 and "unknown reward function" in bad.stderr


def test_reward_model_scorer_over_http_weights_and_counts_failures():
    """The generators' scorer with an HTTP endpoint: scores weighted into the total, each part
    reported on its own; a failed request scores the model part 0 and is counted."""
    from dapo_async.config import load_config
    from dapo_async.reward.compose import RewardComposer
    from dapo_async.reward.model_client import RewardModelScorer

    server = http.server.HTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/score"
    rc = load_config(
        None,
        [f"reward.model_endpoint={url}", "reward.model_weight=0.5", "reward.model_timeout_s=2"],
    ).reward
    scorer = RewardModelScorer.from_config(rc, url, None)
    composer = RewardComposer(rc)
    assert composer.component_names == ("correct", "overlong", "model")
    try:
        (m,) = scorer.score(["abcd"])
        s = composer.combine({"score": 1.0, "acc": 1.0}, 3, model_score=m)
        assert m == 4.0 and s.reward == 1.0 + 0.5 * 4.0 and s.components == (1.0, 0.0, 4.0)
        assert scorer.score(["boom"]) == [0.0] and scorer.failures == 1  # HTTP 500
    finally:
        server.shutdown()
        server.server_close()
    assert scorer.score(["a", "b"]) == [0.0, 0.0] and scorer.failures == 2  # unreachable
