"""Batch sizes that adapt at run time: an out-of-memory error halves one for the rest of the run.

The config keeps what the user set (and what reporters were told); an AdaptiveBatch says what
the node runs with now, and which halvings the next round record reports.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


class OutOfMemory(RuntimeError):
    """Out of GPU memory even at batch 1: the message says what setting to change."""


class AdaptiveBatch:
    """The running value of one batch-size setting (`setting`, e.g. 'train.micro_batch_size')."""

    def __init__(self, setting: str, configured: int) -> None:
        self.setting = setting
        self.value = configured
        self._unreported = False

    def halve_after_oom(self, where: str, at_one: str) -> None:
        """After an out-of-memory error: free the allocator's cached blocks and halve the
        value (kept so for later rounds), or raise OutOfMemory(`at_one`) at 1."""
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if self.value == 1:
            raise OutOfMemory(at_one) from None
        log.warning("out of memory %s %d -> %d", where, self.value, self.value // 2)
        self.value //= 2
        self._unreported = True

    def take_halving(self) -> dict[str, int]:
        """{setting: value now} if halved since the last call, else {}."""
        if not self._unreported:
            return {}
        self._unreported = False
        return {self.setting: self.value}
