import contextlib
import os
import pickle

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dapo_async import protocol as P

ARRAY_FIELDS = (
    "prompt_tokens",
    "response_lens",
    "tokens",
    "logprobs",
    "versions",
    "rewards",
    "acc",
    "components",
    "finish",
)


def make_group(seq=0, g=3, rng=None, gen="gen-0"):
    rng = rng or np.random.default_rng(seq)
    lens = rng.integers(1, 6, g).astype(np.int32)
    t = int(lens.sum())
    return P.Group(
        generator_id=gen,
        seq=seq,
        prompt_id=100 + seq,
        prompt_tokens=rng.integers(0, 50, 4).astype(np.int32),
        response_lens=lens,
        tokens=rng.integers(0, 50, t).astype(np.int32),
        logprobs=-rng.random(t).astype(np.float32),
        versions=rng.integers(0, 3, t).astype(np.int32),
        rewards=rng.standard_normal(g).astype(np.float32),
        acc=(rng.random(g) > 0.5).astype(np.float32),
        components=rng.standard_normal((g, 2)).astype(np.float32),
        finish=rng.integers(0, 2, g).astype(np.uint8),
        gen_time_s=0.25,
    )


def batch_of(n, **kw):
    return P.GroupBatch.from_groups(
        [make_group(i, **kw) for i in range(n)], ["correct", "overlong"]
    )


EXAMPLES = [
    P.Hello("gen-0", 123, "vllm", "127.0.0.1"),
    P.Hello("spare0-1a", 124, "hf", spare=True),
    P.Heartbeat("gen-0", 4, 2),
    P.LeaseRequest("gen-0", 8),
    P.LeaseGrant(
        [1, 2],
        [[5, 6, 7], [8]],
        ["42", "7"],
        ["tiny:arith", "math_dapo"],
        3,
        0.0,
        min_version=2,
        max_staleness=1,
    ),
    P.ScoredGroups(batch=batch_of(3)),
    P.Ack([("gen-0", 1), ("gen-0", 2)], ["stored", "duplicate"]),
    P.BatchRequest(1, 2, 17),
    P.Batch(17, 1, True, 40, 8, 0.0, {"buffer/produced": 12.0}, batch_of(2)),
    P.CheckpointNotice(12, "ckpt-000012"),
    P.RewardRequest(7, ["prompt one response", "prompt two response"]),
    P.RewardReply(7, [0.25, -1.5]),
    P.StoreRequest(3, "set", ["wsync/0/1"], "AAEC"),
    P.StoreReply(3, True, "AAEC"),
]


def wire(msg):
    return [bytes(memoryview(f)) for f in P.encode(msg)]


def assert_same(a, b):
    assert type(a) is type(b)
    if not a.HAS_GROUPS:
        assert a == b
        return
    for f in a.__dataclass_fields__:
        if f != "batch":
            assert getattr(a, f) == getattr(b, f)
    assert a.batch.component_names == b.batch.component_names
    assert a.batch.group_ids() == b.batch.group_ids()
    for ga, gb in zip(a.batch, b.batch, strict=False):
        assert ga.prompt_id == gb.prompt_id and ga.gen_time_s == gb.gen_time_s
        for name in ARRAY_FIELDS:
            np.testing.assert_array_equal(getattr(ga, name), getattr(gb, name))


def test_examples_cover_every_kind():
    assert {m.KIND for m in EXAMPLES} == set(P.MESSAGE_TYPES)


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: m.KIND)
def test_round_trip_every_kind(msg):
    assert_same(P.decode(wire(msg)), msg)


def test_group_batch_views_are_zero_copy_and_select_works():
    b = batch_of(5)
    frames = wire(P.ScoredGroups(batch=b))
    d = P.decode(frames).batch
    # decoded columns are views of the received data frame
    assert not d.cols["tokens"].flags.owndata
    sel = d.select([4, 1])
    assert sel.group_ids() == [("gen-0", 4), ("gen-0", 1)]
    assert_same(P.decode(wire(P.ScoredGroups(batch=sel))), P.ScoredGroups(batch=b.select([4, 1])))


def test_empty_batch_round_trips():
    d = P.decode(wire(P.Batch(3, 0, False, wait_s=0.5)))
    assert len(d.batch) == 0 and d.wait_s == 0.5


def _header(frames):
    return msgpack.unpackb(frames[0], raw=False)


def _with_header(frames, h):
    return [msgpack.packb(h), *frames[1:]]


def test_wrong_schema_version():
    frames = wire(EXAMPLES[0])
    h = _header(frames)
    h["v"] = P.SCHEMA_VERSION + 1
    with pytest.raises(P.ProtocolError) as e:
        P.decode(_with_header(frames, h))
    assert e.value.reason == "bad_version"


def test_unknown_kind_and_unknown_field_and_missing_field():
    frames = wire(EXAMPLES[0])
    h = _header(frames)
    with pytest.raises(P.ProtocolError, match="unknown_kind"):
        P.decode(_with_header(frames, {**h, "k": "exec"}))
    with pytest.raises(P.ProtocolError, match="bad_field"):
        P.decode(_with_header(frames, {**h, "h": {**h["h"], "evil": 1}}))
    hh = dict(h["h"])
    del hh["pid"]
    with pytest.raises(P.ProtocolError, match="missing"):
        P.decode(_with_header(frames, {**h, "h": hh}))
    with pytest.raises(P.ProtocolError, match="bad_field"):
        P.decode(_with_header(frames, {**h, "h": {**h["h"], "pid": "123"}}))


def _mutate_group(fn):
    g = make_group(0)
    fn(g)
    return wire(P.ScoredGroups(batch=P.GroupBatch.from_groups([g], ["correct", "overlong"])))


@pytest.mark.parametrize(
    "field,value,reason",
    [
        ("rewards", np.nan, "non_finite"),
        ("rewards", np.inf, "non_finite"),
        ("logprobs", np.nan, "non_finite"),
        ("logprobs", -np.inf, "non_finite"),
        ("logprobs", 0.5, "non_finite"),
        ("acc", np.nan, "non_finite"),
        ("components", np.inf, "non_finite"),
        ("tokens", -1, "bad_value"),
        ("versions", -3, "bad_value"),
        ("finish", 9, "bad_value"),
    ],
)
def test_bad_values_rejected(field, value, reason):
    def fn(g):
        arr = getattr(g, field).copy()
        arr.flat[0] = value
        setattr(g, field, arr)

    with pytest.raises(P.ProtocolError) as e:
        P.decode(_mutate_group(fn))
    assert e.value.reason == reason


def test_mismatched_lengths_rejected():
    frames = wire(P.ScoredGroups(batch=batch_of(2)))
    h = _header(frames)
    for i, spec in enumerate(h["a"]):
        if spec[0] == "tokens":  # claim one token fewer than response_lens adds up to
            bad = {
                **h,
                "a": [*h["a"][:i], [spec[0], spec[1], [spec[2][0] - 1], spec[3]], *h["a"][i + 1 :]],
            }
    with pytest.raises(P.ProtocolError) as e:
        P.decode(_with_header(frames, bad))
    assert e.value.reason == "length_mismatch"
    g = make_group(0)
    g.rewards = g.rewards[:-1]
    with pytest.raises((P.ProtocolError, ValueError)):
        P.decode(wire(P.ScoredGroups(batch=P.GroupBatch.from_groups([g], ["correct", "overlong"]))))
    with pytest.raises(P.ProtocolError, match="length_mismatch"):
        P.decode(wire(P.LeaseGrant([1, 2], [[1]], ["1"], ["x"], 0)))
    with pytest.raises(P.ProtocolError, match="length_mismatch"):
        P.decode(wire(P.Ack([("g", 1)], [])))
    with pytest.raises(P.ProtocolError, match="max_staleness"):
        P.decode(wire(P.LeaseGrant([1], [[1]], ["1"], ["x"], 0, max_staleness=-2)))


def test_size_limits():
    frames = wire(P.ScoredGroups(batch=batch_of(4)))
    with pytest.raises(P.ProtocolError) as e:
        P.decode(frames, max_bytes=100)
    assert e.value.reason == "too_large"
    with pytest.raises(P.ProtocolError, match="too_large"):
        P.decode([frames[0]] * (P.MAX_FRAMES + 1))
    with pytest.raises(P.ProtocolError, match="too_large"):
        P.decode([b"\x00" * (P.MAX_HEADER_BYTES + 1)])


def test_pickle_payload_is_rejected_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    payload = pickle.dumps(Evil())
    for frames in (
        [payload],
        [payload, payload],
        [msgpack.packb({"v": 1, "k": "hello", "h": payload, "a": []})],
    ):
        with pytest.raises(P.ProtocolError):
            P.decode(frames)
    assert not marker.exists()


def test_msgpack_extension_types_rejected():
    frames = wire(EXAMPLES[0])
    h = _header(frames)
    h["h"]["host"] = msgpack.ExtType(42, b"x")
    with pytest.raises(P.ProtocolError):
        P.decode(_with_header(frames, h))


VALID = [wire(m) for m in EXAMPLES]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=512), min_size=0, max_size=4))
def test_random_bytes_never_crash(frames):
    with contextlib.suppress(P.ProtocolError):
        P.decode(frames)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(range(len(VALID))), st.data())
def test_truncated_frames_raise(idx, data):
    frames = VALID[idx]
    which = data.draw(st.integers(0, len(frames) - 1))
    cut = data.draw(st.integers(0, max(0, len(frames[which]) - 1)))
    bad = list(frames)
    bad[which] = frames[which][:cut]
    with pytest.raises(P.ProtocolError):
        P.decode(bad)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(range(len(VALID))), st.data())
def test_bit_flips_raise_or_decode_cleanly(idx, data):
    frames = [bytearray(f) for f in VALID[idx]]
    which = data.draw(st.integers(0, len(frames) - 1))
    if not frames[which]:
        return
    pos = data.draw(st.integers(0, len(frames[which]) - 1))
    frames[which][pos] ^= data.draw(st.integers(1, 255))
    try:
        msg = P.decode([bytes(f) for f in frames])
    except P.ProtocolError:
        return
    assert isinstance(msg, P.Message)  # a flip in a value may still be a valid message
    if msg.HAS_GROUPS:  # then everything the validator promises still holds
        msg.batch.validate()


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(P.MESSAGE_TYPES)), msgpack_values, msgpack_values)
def test_random_headers_raise_typed_error(kind, fields, arrays):
    header = msgpack.packb({"v": P.SCHEMA_VERSION, "k": kind, "h": fields, "a": arrays})
    with contextlib.suppress(P.ProtocolError):
        P.decode([header])


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_random_valid_batches_round_trip(n, seed):
    rng = np.random.default_rng(seed)
    groups = [make_group(i, g=int(rng.integers(1, 5)), rng=rng, gen=f"g{i % 2}") for i in range(n)]
    msg = P.ScoredGroups(batch=P.GroupBatch.from_groups(groups, ["correct", "overlong"]))
    assert_same(P.decode(wire(msg)), msg)


def test_groups_without_reward_components_round_trip():
    g = make_group(0)
    g.components = np.zeros((g.num_responses, 0), np.float32)
    msg = P.ScoredGroups(batch=P.GroupBatch.from_groups([g, g], []))
    assert_same(P.decode(wire(msg)), msg)


def test_oversized_names_are_refused():
    """Ids are kept in memory by the buffer: a Hello carrying a 1 MB id is a protocol error."""

    big = P.encode(P.Hello("g" * 1_000_000, 1, "hf"))
    with pytest.raises(P.ProtocolError, match="too_large"):
        P.decode(big)
    assert P.decode(P.encode(P.Hello("g" * 256, 1, "hf"))).generator_id == "g" * 256


def test_store_requests_are_bounded():
    P.StoreRequest(1, "check", [f"k{i}" for i in range(100)]).validate()
    bad = [
        P.StoreRequest(1, "drop_all", ["k"]),  # unknown op
        P.StoreRequest(1, "get", ["a", "b"]),  # one key per get
        P.StoreRequest(1, "set", []),
        P.StoreRequest(1, "get", ["k" * 600]),
    ]
    for msg in bad:
        with pytest.raises(P.ProtocolError):
            P.decode(wire(msg))
