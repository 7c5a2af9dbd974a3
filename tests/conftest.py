"""Shared pytest setup: one torch thread per test process (two cores, several processes)."""

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def cli_env() -> dict:
    """Environment for running `python -m dapo_async.cli` in a subprocess."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return env


@pytest.fixture
def python() -> str:
    return sys.executable


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The built-in tiny model with a short warm start (pipeline tests need a real HF
    directory, not a trained policy)."""
    from dapo_async.tiny.build import build

    d = tmp_path_factory.mktemp("tiny") / "model"
    build(d, seed=0, task="chain", sft_steps=20, log=lambda s: None)
    return d
