"""Capped, jittered exponential backoff shared by every retry loop.

Each failure doubles (``factor``) the delay from ``initial`` up to ``maximum``; the
delay actually used is shrunk by a random share of up to ``jitter`` so that many
agents failing at the same moment do not retry in lockstep. The cap is never
exceeded. ``random`` is injectable so tests get deterministic delays.
"""

import random as _random


class Backoff:
    """Delays for consecutive failures; ``reset()`` after a success."""

    def __init__(self, initial=0.5, maximum=30.0, factor=2.0, jitter=0.2, random=None):
        if initial <= 0 or maximum < initial:
            raise ValueError(f"backoff needs 0 < initial <= maximum, got {initial}, {maximum}")
        if factor < 1:
            raise ValueError(f"backoff factor must be >= 1, got {factor}")
        if not 0 <= jitter < 1:
            raise ValueError(f"backoff jitter must be in [0, 1), got {jitter}")
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self.jitter = jitter
        self._random = random if random is not None else _random.random
        self.failures = 0

    def next_delay(self):
        """The delay before the next attempt; counts one more failure."""
        exponent = min(self.failures, 64)
        base = min(self.maximum, self.initial * (self.factor ** exponent))
        self.failures += 1
        return base * (1.0 - self.jitter * self._random())

    def reset(self):
        """Forget earlier failures: the next delay is ``initial`` again."""
        self.failures = 0
