"""Misbehaving reward functions for the pool tests (imported by name in worker processes)."""

import os
import time


def hang(response, truth):
    if response == "hang":
        time.sleep(3600)
    return {"score": 1.0 if response == truth else -1.0}


def crash(response, truth):
    if response == "crash":
        os._exit(3)
    return 1.0 if response == truth else -1.0


def raises(response, truth):
    if response == "raise":
        raise RuntimeError("verifier bug")
    return 1.0


def nan(response, truth):
    return float("nan") if response == "nan" else 1.0
