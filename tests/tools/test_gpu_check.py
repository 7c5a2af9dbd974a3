"""`tools/gpu_check.sh`'s stages, on the CPU: every stage runs even after one fails, each one's
result is in the JSON with the failure named, and the plan has every stage the docs promise."""

from pathlib import Path

from dapo_async.tools import gpu_check


def test_every_stage_runs_and_a_failure_is_named():
    ran = []

    def ok(name):
        return lambda: ran.append(name) or {"figure": 1.0}

    def broken():
        ran.append("broken")
        raise gpu_check.StageFailed("exit 1: something specific went wrong")

    results, failed = gpu_check.run_stages([("a", ok("a")), ("broken", broken), ("c", ok("c"))])
    assert ran == ["a", "broken", "c"] and failed == ["broken"]
    assert results["a"]["ok"] and results["a"]["figure"] == 1.0 and results["c"]["ok"]
    assert not results["broken"]["ok"] and "something specific" in results["broken"]["error"]


def test_the_plan_has_every_stage_and_each_a_timeout_inside_ten_minutes():
    one = [name for name, _ in gpu_check.stages(1, False, Path("runs/x"))]
    assert one == [
        "tiny",
        "tests",
        "main_stream",
        "main_batch",
        "bench_learner",
        "bench_weights",
        "bench_generator",
    ]
    two = [name for name, _ in gpu_check.stages(2, True, Path("runs/x"))]
    assert two[-1] == "two_gpus"
    assert set(gpu_check.STAGE_TIMEOUT_S) == set(two)
    assert sum(gpu_check.STAGE_TIMEOUT_S[name] for name in one) <= 600
    for path in gpu_check.GPU_TESTS + gpu_check.VLLM_TESTS:
        assert (Path(__file__).resolve().parents[2] / path).is_file(), path


def test_a_stage_that_hangs_fails_instead_of_the_check(python):
    import pytest

    with pytest.raises(gpu_check.StageFailed, match="timed out"):
        gpu_check._run([python, "-c", "import time; time.sleep(30)"], timeout_s=1)
