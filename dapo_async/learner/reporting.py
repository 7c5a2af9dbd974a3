"""What learner rank 0 reports after each step beyond the training scalars: the responses it
trained, readable (``samples.py``), the step's staleness and importance-weight distributions
(Aim ``Distribution``), alerts (``alerts.py``: logged when they start, flagged in the metrics)
and what the process uses (``resources.py``).

    trainer.step(...) ─► StepReport.after_step(trainer, metrics) ─► tracker.track(metrics)
"""

from __future__ import annotations

from functools import partial

from dapo_async.alerts import Alerts
from dapo_async.resources import ResourceMeter
from dapo_async.sample_records import render, trained_record
from dapo_async.samples import SampleLog


class StepReport:
    def __init__(self, cfg, tracker, decode, log, weight_sync_bytes=None):
        show = partial(render, decode=decode)
        self.meter = ResourceMeter(weight_sync_bytes)
        self.samples = SampleLog.for_role(cfg, "learner", tracker, show)
        self.alerts = Alerts(cfg.tracking)
        self.tracker = tracker
        self.log = log

    def after_step(self, trainer, metrics: dict) -> None:
        """Adds the ``alert/*`` flags and ``resources/*`` to ``metrics``; writes records and
        distributions."""
        flags, started = self.alerts.check(metrics)
        metrics.update(flags)
        metrics.update(self.meter.metrics())
        for message in started:
            self.log.warning("ALERT: %s", message)
        step = trainer.version
        for row in trainer.recorded:
            self.samples.write(trained_record(step, row))
        for name, values in trainer.distributions.items():
            self.tracker.distribution(f"dist/{name}", values, step)
