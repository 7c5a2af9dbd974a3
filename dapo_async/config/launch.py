"""The ``launch`` section: processes, addresses, security, restarts, and how roles on one host
share its cores."""

from __future__ import annotations

from dataclasses import dataclass

from dapo_async.config.fields import F


@dataclass
class LaunchConfig:
    host: str = F(
        "127.0.0.1",
        "Address the buffer binds to (non-loopback needs CurveZMQ keys), and the host of the "
        "weight-sync store when weight_sync.endpoint is empty.",
        nonempty=True,
    )
    auth: bool = F(
        True,
        "Authenticate every ZeroMQ link with CurveZMQ (per-run keys when curve_keys_dir is "
        "empty), loopback included; the buffer accepts each message kind only from the role "
        "that may send it. false: no authentication (loopback binds only).",
    )
    curve_keys_dir: str = F(
        "",
        "Directory made by `dapo-async keys` (shared by hosts of one run); empty = the run's "
        "own keys in <run_dir>/keys (with launch.auth).",
    )
    insecure_allow_public_bind: bool = F(
        False, "Allow a non-loopback bind without CurveZMQ (logged loudly). Do not."
    )
    buffer_endpoint: str = F("", "Endpoint generators and learners connect to; empty = local.")
    torch_threads: int = F(1, "torch threads per process (1 when roles share few cores).", ge=1)
    share_cores: bool = F(
        False,
        "Roles on one host lend their torch threads while they wait (the learner for data, an "
        "hf generator for leases) to the roles there that compute (docs/architecture.md, "
        "'Cores follow the work'). Off by default: on a 2-core CPU it sped up synchronous runs "
        "~20%; its effect on asynchronous ones is not settled (docs/results.md).",
    )
    lend_idle_above: float = F(
        0.5,
        "A waiting role lends its threads only while its recent idle ratio (moving average "
        "over its last steps) is above this: a role that waits now and then keeps its core "
        "(0.5: a synchronous run's learner, idle ~0.6, lends; the main job's asynchronous "
        "learner, idle 0.05-0.3, does not).",
        ge=0,
        le=1,
    )
    spare_generators: int = F(
        0,
        "Extra hf generators (`dapo-async train` starts them as spare0, spare1, ...) at the "
        "operating system's idle priority (SCHED_IDLE: they run only on a core no other process "
        "wants) that decode while the learner's recent idle ratio says it waits for data, and "
        "park when batches queue up (docs/architecture.md, 'Spare generators'). 0 = none. Pays "
        "where generation is the bottleneck (the long-tail workload); costs where the learner "
        "already keeps up (docs/results.md). Not with launch.share_cores.",
        ge=0,
    )
    spare_idle_above: float = F(
        0.2,
        "A spare generator starts decoding once the learner's idle ratio (moving average over "
        "its last steps) is above this, and parks once it falls below a quarter of it.",
        ge=0,
        le=1,
    )
    spare_max_inflight: int = F(
        -1,
        "Sequences a spare generator decodes at once, in whole prompts (stream mode; batch "
        "mode: its batch). A spare decodes only while the learner waits, so a batch as wide as "
        "a generator's takes several learner steps to finish and its groups go stale (the "
        "buffer drops them) or restart. -1 = auto: a quarter of generator.inflight_target, at "
        "least one prompt (the slow long-tail run on a 2-core EPYC, 192 sequences: learner idle "
        "0.16 and 0.14 at 48, 0.19 and 0.20 at 192, with fewer of the spare's groups stale; "
        "docs/results.md); 0 = a generator's width.",
        ge=-1,
    )
    restart_roles: bool = F(
        True,
        "Restart a buffer that dies (from its write-ahead log, needs buffer.wal) and a learner "
        "that dies (from its latest checkpoint) instead of ending the run.",
    )
    allow_generator_restarts: bool = F(True, "Restart a generator that dies instead of failing.")
    max_restarts: int = F(
        10, "Most restarts of one role within launch.restart_window_s; more ends the run.", ge=0
    )
    restart_window_s: float = F(600.0, "Window of launch.max_restarts, seconds.", gt=0)
    shutdown_timeout_s: float = F(20.0, "Grace period before roles are killed on shutdown.", gt=0)
