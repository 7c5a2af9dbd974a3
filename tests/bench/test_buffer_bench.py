from dapo_async.bench.buffer_bench import run


def test_buffer_bench_reports_figures():
    res = run(num_groups=400, batch=16, response_len=16, groups_per_step=8)
    assert res["groups_per_s_ingest"] > 0 and res["groups_per_s_served"] > 0
    assert res["steps_served"] == 400 // 8
    assert "rss_mb_per_10k_groups" in res
