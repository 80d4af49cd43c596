"""Which KV-cache row holds each slot's request, kept so that the running requests fill the first rows.

A decode graph of batch ``b`` attends to the cache's first ``b`` rows as they lie (a view, no
gather of every row's whole context per layer). So before each decode, the ``n`` running requests
must hold rows ``0 .. n-1`` in some order: :meth:`Rows.compact` frees the rows of requests that
left and moves each running request that lies at row ``n`` or past it into a freed row below
(one copy of its keys and values so far; at most one per request that left). A request that takes
over a slot takes its row back, so a slot reused at once moves nothing. Rows past ``n`` hold no
running request, which is what makes them safe for a bucket's pad rows.

Plain Python, no torch: the graph backend asks it and does the copies.
"""

from __future__ import annotations


class Rows:
    """The rows of ``count`` slots; the engine's slots are 0 .. count-1."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.row_of: dict[int, int] = {}

    def take(self, slot: int) -> int:
        """The row a request prefilled into ``slot`` gets: the slot's own if it has one, else the lowest free."""
        if slot not in self.row_of:
            used = set(self.row_of.values())
            self.row_of[slot] = next(row for row in range(self.count) if row not in used)
        return self.row_of[slot]

    def compact(self, running: list[int]) -> list[tuple[int, int, int]]:
        """Make the ``running`` slots hold rows 0 .. len(running)-1: ``(slot, from_row, to_row)``
        for each request whose keys and values must move, in the order to copy them."""
        alive = set(running)
        self.row_of = {slot: row for slot, row in self.row_of.items() if slot in alive}
        n = len(running)
        free = sorted(set(range(n)) - set(self.row_of.values()))
        moves = []
        for slot in running:
            if self.row_of[slot] >= n:
                moves.append((slot, self.row_of[slot], free.pop(0)))
                self.row_of[slot] = moves[-1][2]
        return moves
