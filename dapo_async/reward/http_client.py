"""HTTP client for reward models already served elsewhere (Triton front-ends, FastAPI apps).

POSTs ``{"texts": [...]}`` (the key is configurable) as JSON and reads a list of numbers from the
reply, either the whole body or the value under ``response_key`` (default ``scores``). Timeouts,
HTTP errors, malformed JSON and non-finite or missing scores raise ``RewardHTTPError``.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request


class RewardHTTPError(RuntimeError):
    pass


class HTTPRewardClient:
    def __init__(
        self,
        url: str,
        timeout_s: float = 30.0,
        request_key: str = "texts",
        response_key: str = "scores",
        headers: dict | None = None,
    ):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"reward URL must start with http:// or https://, got {url!r}")
        self.url = url
        self.timeout_s = timeout_s
        self.request_key = request_key
        self.response_key = response_key
        self.headers = {"Content-Type": "application/json", **(headers or {})}

    def score(self, texts: list[str]) -> list[float]:
        body = json.dumps({self.request_key: list(texts)}).encode()
        req = urllib.request.Request(self.url, data=body, headers=self.headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raise RewardHTTPError(f"{self.url} answered HTTP {e.code}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as e:
            raise RewardHTTPError(f"{self.url} unreachable: {e}") from None
        try:
            data = json.loads(raw)
        except json.JSONDecodeError:
            raise RewardHTTPError(f"{self.url} did not return JSON") from None
        scores = data.get(self.response_key) if isinstance(data, dict) else data
        if not isinstance(scores, list) or len(scores) != len(texts):
            raise RewardHTTPError(
                f"{self.url} returned {type(scores).__name__}, expected {len(texts)} scores"
            )
        out = []
        for s in scores:
            if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s):
                raise RewardHTTPError(
                    f"{self.url} returned a non-finite or non-numeric score: {s!r}"
                )
            out.append(float(s))
        return out
