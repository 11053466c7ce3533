"""The fake engine's prefix cache: which leading part of a prompt an engine would serve
from its KV cache, so benchmarks and tests of routing (`agentserve bench affinity
--engine fake`) see prefix hits land where the prompts went, without a model.

Like vLLM's automatic prefix caching it works in whole blocks: a prompt's words in blocks
of BLOCK_WORDS, each block named by a hash chained through the blocks before it; the
cached part is the run of leading blocks seen before (on this engine), and every full
block of the prompt is remembered afterwards (least recently used dropped first).
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["BLOCK_WORDS", "FakePrefixCache"]

BLOCK_WORDS = 16


class FakePrefixCache:
    """Block hashes of the prompts this engine has seen, at most `capacity_blocks`."""

    def __init__(self, capacity_blocks: int = 50_000):
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def serve(self, words: list[str]) -> int:
        """How many of `words` (a prompt) the cache holds as leading full blocks; then
        remembers every full block of it."""
        chained, cached, hit = 0, 0, True
        for start in range(0, len(words) - len(words) % BLOCK_WORDS, BLOCK_WORDS):
            chained = hash((chained, tuple(words[start : start + BLOCK_WORDS])))
            if hit and chained in self._blocks:
                cached += BLOCK_WORDS
            else:
                hit = False
            self._blocks[chained] = None
            self._blocks.move_to_end(chained)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
        return cached
