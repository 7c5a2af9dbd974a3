"""`dapo-async bench decoder`: the hf stream decoder's tokens/s beside its forward's ceiling,
lean decode step and transformers' forward measured in one run."""

import json

from testutil import run_cli


def test_decoder_bench_reports_both_decoders_and_their_ceilings(tiny_model, repo, cli_env):
    out = run_cli(
        repo, cli_env, "bench", "decoder", "--config", "configs/tiny_cpu.yaml",
        f"model.path={tiny_model}", "generator.prompts_per_batch=4", "--seconds", "0.6",
        "--rounds", "1", "--json", timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    for name in ("lean", "plain"):
        assert r[f"stream_tokens_per_s_{name}"] > 0 and r[f"forward_tokens_per_s_{name}"] > 0
        assert r[f"stream_of_ceiling_{name}"] == (
            r[f"stream_tokens_per_s_{name}"] / r[f"forward_tokens_per_s_{name}"]
        )
    assert r["lean_speedup"] > 0 and r["width"] == 4 * 8  # prompts_per_batch × responses
    # the C attention kernel (on by default on a CPU) beside the lean step with torch's
    assert r["attention_kernel_speedup"] == (
        r["stream_tokens_per_s_lean"] / r["stream_tokens_per_s_torchattention"]
    )
    assert "its attention in C ×" in out.stdout + out.stderr  # the summary line


def test_without_the_attention_kernel_there_is_nothing_to_compare(tiny_model, repo, cli_env):
    out = run_cli(
        repo, cli_env, "bench", "decoder", "--config", "configs/tiny_cpu.yaml",
        f"model.path={tiny_model}", "generator.prompts_per_batch=2", "--seconds", "0.3",
        "--rounds", "1", "generator.compiled_attention=false", "--json", timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert "attention_kernel_speedup" not in r and "stream_tokens_per_s_torchattention" not in r


def test_decoder_bench_refuses_vllm(repo, cli_env):
    out = run_cli(repo, cli_env, "bench", "decoder", "generator.engine=vllm", timeout=120)
    assert out.returncode != 0 and "generator.engine=hf" in out.stderr
