"""dapo_async: asynchronous off-policy actor-learner RL for LLMs with DAPO.

``dapo_async.train(config, **overrides)`` and ``dapo_async.evaluate(...)``: the Python API
(``api.py``); everything else is the ``dapo-async`` command line."""

__version__ = "0.1.0"


def train(*args, **kwargs) -> dict:
    from dapo_async.api import train as _train

    return _train(*args, **kwargs)


def evaluate(*args, **kwargs) -> dict:
    from dapo_async.api import evaluate as _evaluate

    return _evaluate(*args, **kwargs)
