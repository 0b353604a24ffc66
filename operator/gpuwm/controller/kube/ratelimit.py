"""A token bucket, so a large cluster's status writes never flood the API server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class TokenBucket:
    """`rate_per_second` tokens a second, at most `burst` saved up; one token per write."""

    def __init__(
        self, rate_per_second: float, burst: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate_per_second <= 0:
            raise ValueError(f"token bucket rate must be > 0 per second, got {rate_per_second}")
        self.rate_per_second = rate_per_second
        self.burst = max(1.0, burst if burst is not None else rate_per_second)
        self._clock = clock
        self._tokens = self.burst
        self._updated = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate_per_second)
        self._updated = now

    def try_acquire(self, tokens: float = 1.0) -> bool:
        """Take `tokens` if they are there now."""
        self._refill()
        if self._tokens >= tokens:
            self._tokens -= tokens
            return True
        return False

    def seconds_until(self, tokens: float = 1.0) -> float:
        """How long until `tokens` are there (0 when they already are)."""
        self._refill()
        return max(0.0, (tokens - self._tokens) / self.rate_per_second)

    async def acquire(self, tokens: float = 1.0) -> None:
        """Wait until `tokens` are there, then take them."""
        while not self.try_acquire(tokens):
            await asyncio.sleep(self.seconds_until(tokens))
