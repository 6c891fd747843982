"""The audit's three outcomes and the exit status of each."""

from __future__ import annotations

from enum import Enum


class Verdict(Enum):
    """PASS: no deviation found by a test that had the power to find one and exercised acceptance
    and the bonus token. FAIL: the output law differs from the target's (p < alpha). INCONCLUSIVE:
    no deviation found, but the acceptance path was not exercised enough to call it a pass."""

    PASS = 0
    FAIL = 1
    INCONCLUSIVE = 3  # 2 is every console script's status for a user error

    @property
    def exit_code(self) -> int:
        return self.value
