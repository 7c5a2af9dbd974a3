"""`bench weights` on a small synthetic model: the publisher, a real receiver process and the
flat-ceiling group all rendezvous through the weight-sync store; the figures are positive."""

from dapo_async.bench.weights_bench import measure


def test_weights_bench_measures_bucketed_and_ceiling():
    res = measure(size_mb=4, rounds=1, bucket_mb=1, backend="gloo")
    assert res["bytes"] > 4e6
    assert res["gb_per_s_bucketed"] > 0 and res["gb_per_s_flat_ceiling"] > 0
    assert res["ratio"] == res["gb_per_s_bucketed"] / res["gb_per_s_flat_ceiling"]


def test_weights_bench_measures_shared_memory_and_a_plain_copy():
    from dapo_async.bench.weights_bench import measure_shm

    res = measure_shm(size_mb=4, rounds=1, bucket_mb=1)
    assert res["gb_per_s_shm"] > 0 and res["gb_per_s_memcpy"] > 0
