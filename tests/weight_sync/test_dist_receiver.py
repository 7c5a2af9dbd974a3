"""The receiver's formation threads against a real store: a formation that overruns its bound
(gloo can take 60 s to give up on a dead member) must not keep the receiver out of the epochs
announced meanwhile, and its group, when it finally comes, is closed rather than adopted."""

import json
import threading
import time

from dapo_async.config import load_config
from dapo_async.weight_sync import dist_receiver
from dapo_async.weight_sync.store import StoreServer


class FakeGroup:
    """Stands in for a gloo group: records whether it was shut down."""

    def __init__(self, epoch):
        self.epoch = epoch
        self.shut = False

    def shutdown(self):
        self.shut = True


def _announce(store, epoch, members):
    store.set(f"epoch/{epoch}", json.dumps(members))
    store.set("latest", json.dumps([epoch, 0]))


def _wait(cond, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_an_overrunning_formation_does_not_keep_the_receiver_out_of_the_next_epoch(monkeypatch):
    release = threading.Event()
    made = {}

    def make_group(store, epoch, rank, size, timeout_s, backend, form_timeout_s=None):
        if epoch == 0:  # stuck far past its bound, like gloo on a dead member
            release.wait(30)
        made[epoch] = FakeGroup(epoch)
        return made[epoch], None

    monkeypatch.setattr(dist_receiver, "make_group", make_group)
    server = StoreServer("127.0.0.1", 0, keys_dir=None)
    store = server.local(10)
    cfg = load_config(None, ["weight_sync.form_timeout_s=1"])
    r = dist_receiver.DistWeightReceiver(
        cfg.weight_sync, None, "g", endpoint=f"127.0.0.1:{server.port}"
    )
    try:
        _announce(store, 0, ["g", "dead"])
        time.sleep(3 * dist_receiver.FORM_POLL_S)  # epoch 0 is forming (stuck)
        _announce(store, 1, ["g"])
        _wait(lambda: r.ready((1, 0)) and 1 in made)  # formed while epoch 0 still hangs
        assert 0 not in made
        assert r._adopt(1) and r.epoch == 1 and r.pg is made[1]
        release.set()
        _wait(lambda: 0 in made and made[0].shut)  # the late group is closed, not kept
        assert r.pg is made[1] and not made[1].shut and 0 not in r._formed
    finally:
        release.set()
        r.close()
        server.close()
    assert made[1].shut  # close() shuts the adopted group


def test_a_round_the_sender_abandoned_ends_at_the_next_epoch_not_the_timeout():
    """A receiver whose group formed on its side while the sender's formation failed waits in
    a broadcast that never completes: it leaves once a newer epoch is announced."""
    import pytest

    from dapo_async.weight_sync.collectives import ABANDON_POLL_S, CollectiveAbandoned, wait_all

    class Stuck:
        def is_completed(self):
            return False

    asked = []

    def abandoned():
        asked.append(time.monotonic())
        return len(asked) >= 2  # the sender announces a newer epoch after the first ask

    with pytest.raises(CollectiveAbandoned):  # not CollectiveTimeout: left before the 60 s
        wait_all([Stuck()], 60.0, abandoned=abandoned)
    assert len(asked) == 2
    assert asked[1] - asked[0] >= ABANDON_POLL_S * 0.9  # asked at most every ABANDON_POLL_S


def test_the_senders_formation_is_bounded_and_a_late_group_is_closed():
    """``form_within``: gloo's formation can overrun its own timeout; the sender gives up at
    its bound, and a group that forms after that is discarded, not leaked."""
    import pytest

    from dapo_async.weight_sync.collectives import CollectiveTimeout, form_within

    assert form_within(lambda: "pg", 5.0, lambda g: None) == "pg"
    with pytest.raises(ValueError, match="refused"):
        form_within(lambda: (_ for _ in ()).throw(ValueError("refused")), 5.0, lambda g: None)

    release, discarded = threading.Event(), []

    def slow():
        release.wait(30)
        return "late"

    with pytest.raises(CollectiveTimeout):  # gave up at the bound: slow() still waits
        form_within(slow, 0.3, discarded.append)
    assert discarded == []
    release.set()
    _wait(lambda: discarded == ["late"])
