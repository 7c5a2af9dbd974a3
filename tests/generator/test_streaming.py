"""A real generator process (hf engine, tiny model) streams scored groups over ZeroMQ to a
receiver that is SIGKILLed and restarted mid-stream: after dedupe by group id every group the
generator produced arrives, none is lost."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dapo_async import transport as T
from dapo_async.utils import free_port

HERE = Path(__file__).resolve().parent


def received(record: Path) -> list[str]:
    return record.read_text().split() if record.exists() else []


def wait_until(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.slow
def test_receiver_killed_mid_stream_loses_nothing(tiny_model, tmp_path, repo, cli_env):
    from transformers import AutoTokenizer

    from dapo_async.data.tasks import generate

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    prompts = [
        [
            tok.apply_chat_template(
                r.messages, add_generation_prompt=True, tokenize=True, return_dict=False
            ),
            r.ground_truth,
        ]
        for r in generate("chain", "train", 64, 3, 0)
    ]
    (tmp_path / "prompts.json").write_text(json.dumps(prompts))
    port = free_port()
    cfg = {
        "name": "stream",
        "run_dir": str(tmp_path / "run"),
        "model": {"path": str(tiny_model)},
        "generator": {"prompts_per_batch": 2, "responses_per_prompt": 4, "max_tokens": 24},
        "reward": {"overlong_max_len": 24, "overlong_cache_len": 6},
        "weight_sync": {"mode": "disk"},
        "tracking": {"aim": False},
        "launch": {"buffer_endpoint": f"tcp://127.0.0.1:{port}"},
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    record, stop = tmp_path / "record.txt", tmp_path / "stop"
    keys = tmp_path / "run" / "keys"  # the run's keys, as `dapo-async train` makes them
    T.generate_keys(keys)

    def start_receiver():
        return subprocess.Popen(
            [
                sys.executable,
                str(HERE / "recording_receiver.py"),
                str(port),
                str(tmp_path / "prompts.json"),
                str(record),
                str(stop),
                str(keys),
            ],
            cwd=repo,
            env=cli_env,
            stdout=open(tmp_path / "receiver.log", "ab"),
            stderr=subprocess.STDOUT,
        )

    recv = start_receiver()
    gen_log = tmp_path / "gen.log"
    gen = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dapo_async.cli",
            "generator",
            str(tmp_path / "cfg.yaml"),
            "--id",
            "streamer",
        ],
        cwd=repo,
        env=cli_env,
        stdout=open(gen_log, "wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: len(received(record)) >= 10, 180, "no groups streamed")
        recv.send_signal(signal.SIGKILL)
        recv.wait()
        killed_at = len(received(record))
        time.sleep(2.0)  # the generator keeps producing into its outbox meanwhile
        recv = start_receiver()
        wait_until(
            lambda: len(set(received(record))) >= killed_at + 20, 180, "stream did not resume"
        )
        gen.send_signal(signal.SIGINT)
        assert gen.wait(timeout=60) == 0, gen_log.read_text()[-3000:]
    finally:
        stop.write_text("1")
        for p in (gen, recv):
            if p.poll() is None:
                p.wait(timeout=30) if p is recv else p.kill()
    log = gen_log.read_text()
    (final,) = (tmp_path / "run" / "generators").glob("streamer-*.json")
    counters = json.loads(final.read_text())
    produced = counters["groups_sent"]
    assert counters["groups_acked"] == produced, counters  # nothing left unacknowledged
    assert "unacknowledged" not in log
    got = received(record)
    seqs = sorted({int(x.rsplit(":", 1)[1]) for x in got})
    assert {x.rsplit(":", 1)[0] for x in got} == {next(iter(got)).rsplit(":", 1)[0]}
    assert seqs == list(range(produced)), "a group was lost"
