"""dapo_async: asynchronous off-policy actor-learner RL for LLMs with DAPO."""

__version__ = "0.1.0"
