"""`bench generator` runs the real loop against its engine and prints the JSON line (the figure
itself is measured by hand: this machine is shared and noisy)."""

from testutil import last_json, run_cli


def test_bench_generator_json_line(tiny_model, cli_env, repo):
    out = run_cli(
        repo,
        cli_env,
        "bench",
        "generator",
        f"model.path={tiny_model}",
        "generator.prompts_per_batch=2",
        "generator.responses_per_prompt=2",
        "--json",
        "--seconds",
        "0.5",
        "--rounds",
        "1",
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    res = last_json(out)
    assert res["engine_tokens_per_s"] > 0 and res["loop_tokens_per_s"] > 0
    assert abs(res["ratio"] - res["loop_tokens_per_s"] / res["engine_tokens_per_s"]) < 1e-9
    assert res["groups_acked"] > 0
