"""Which connection speaks for which generator: a generator id belongs to the connection (the
ZeroMQ routing id of its socket) that first spoke for it, so a peer holding the generators' key
cannot act in another live generator's name — heartbeat for it, lease in its name, or send
groups on its leases (lease ids are sequential: easy to guess).

    message claiming ids {g…} from connection c, at time t:
        every g unbound, bound to c, or bound to a connection silent > REBIND_SILENT_S
            ──► admitted; each g bound to c, last seen t
        else ──► refused (counted as malformed "impersonation", no reply)

A generator that reconnects (a new routing id) takes its id back once its old connection has
been silent REBIND_SILENT_S, a few heartbeats: a restarted or reconnected generator heals by
itself, an impersonator can only take over the id of a generator that is gone.
"""

from __future__ import annotations

from dapo_async import protocol

# Three missed heartbeats (generator.heartbeat_s = 2 s): the old connection is gone.
REBIND_SILENT_S = 6.0
# Bindings of ids silent this long are forgotten (bounded memory over a long run).
FORGET_AFTER_S = 3600.0


def claimed_ids(msg: protocol.Message) -> set[str]:
    """The generator ids a message speaks for (none for the learner's messages)."""
    if isinstance(msg, protocol.GeneratorMessage):
        return {msg.generator_id}
    if isinstance(msg, protocol.ScoredGroups):
        return set(msg.batch.gen_ids)
    return set()


class Identities:
    def __init__(self) -> None:
        self.bound: dict[str, tuple[bytes, float]] = {}  # generator id -> (routing id, last seen)

    def admits(self, conn: bytes, msg: protocol.Message, now: float) -> bool:
        ids = claimed_ids(msg)
        for gid in ids:
            owner = self.bound.get(gid)
            if owner is not None and owner[0] != conn and now - owner[1] <= REBIND_SILENT_S:
                return False
        for gid in ids:
            self.bound[gid] = (conn, now)
        return True

    def forget_silent(self, now: float) -> None:
        for gid in [g for g, (_, t) in self.bound.items() if now - t > FORGET_AFTER_S]:
            del self.bound[gid]
