"""A clock's backwards jump (a bag that loops or restarts) told apart from ordinary disorder.

Below the core with the TF buffer, which clears its history on a jump; core's recorder policy
and odometry history use the same detector.
"""

from __future__ import annotations

# A clock going back by more than this is a jump (a bag that loops or restarts); less is the
# ordinary disorder of messages from different topics.
DEFAULT_JUMP_THRESHOLD_S = 1.0


class TimeJumpDetector:
    """High-water mark of a clock; reports a backwards jump larger than the threshold. The
    one detector the recorder, the TF buffer and the odometry history all use."""

    def __init__(self, threshold_s: float = DEFAULT_JUMP_THRESHOLD_S) -> None:
        if threshold_s < 0.0:
            raise ValueError(f"jump_threshold_s must be >= 0, got {threshold_s}")
        self.threshold_s = threshold_s
        self.high: float | None = None

    def jumped_back(self, now_s: float) -> bool:
        now = float(now_s)
        if self.high is not None and now < self.high - self.threshold_s:
            self.high = now
            return True
        self.high = now if self.high is None else max(self.high, now)
        return False

    def reset(self) -> None:
        self.high = None
