"""`dapo-async bench packing` runs and prints its figures (measurements, not asserted)."""

from testutil import last_json, run_cli

from dapo_async.bench.packing_bench import GROUP_SIZE, NUM_GROUPS, longtail_groups


def test_longtail_batches_have_a_long_tail():
    lens = [n for g in longtail_groups(0) for n in g.response_lens.tolist()]
    assert len(lens) == NUM_GROUPS * GROUP_SIZE
    assert max(lens) >= 4 * sorted(lens)[len(lens) // 2]  # the longest dwarfs the median


def test_bench_packing_prints_both_rates(repo, cli_env):
    out = run_cli(repo, cli_env, "bench", "packing", "--rounds", "1", "--json", timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    res = last_json(out)
    assert res["padded_tokens_per_s"] > 0 and res["packed_tokens_per_s"] > 0
    ratio = res["packed_tokens_per_s"] / res["padded_tokens_per_s"]
    assert abs(res["packing_speedup"] - ratio) < 0.01
    assert "[bench packing]" in out.stderr
