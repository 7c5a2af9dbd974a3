import json
import subprocess
import sys


def test_bench_transport_json_line(cli_env, repo):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dapo_async.cli",
            "bench",
            "transport",
            "--json",
            "--seconds",
            "0.3",
            "--batch",
            "4",
        ],
        capture_output=True,
        text=True,
        cwd=repo,
        env=cli_env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    for key in (
        "ratio_single",
        "ratio_batched",
        "mb_per_s_batched",
        "traj_per_s_single",
        "traj_per_s_batched",
    ):
        assert key in res and res[key] > 0
    assert res["batch_groups"] == 4
    assert "ratio_batched=" in out.stderr  # the human-readable table goes to stderr
