"""Which KV-cache row holds each slot's request, kept so that the running requests fill the first rows.

A decode graph of batch ``b`` attends to the cache's first ``b`` rows as they lie (a view, no
gather of every row's whole context per layer). So before each decode, the ``n`` running requests
must hold rows ``0 .. n-1`` in some order: :meth:`Rows.compact` frees the rows of requests that
left and moves each running request that lies at row ``n`` or past it into a freed row below
(one copy of its keys and values so far; at most one per request that left). A request that takes
over a slot takes its row back, so a slot reused at once moves nothing.

A request whose prompt is prefilled in chunks (``--prefill-chunk``) holds a row between steps
before it decodes: the ``holding`` slot (the engine prefills one prompt at a time, so there is at
most one). It keeps its keys and values but must not stand in a row below ``n``, so a running
request that needs its row exchanges rows with it (``SlotCache.exchange``: the holding request
goes up to the running one's old row, which is past ``n``). Rows past ``n`` hold no running
request; the holding one may lie in a bucket's pad row, which is why pad rows write only the
context's last position, one no request ever writes (``graphs.padded``).

Plain Python, no torch: the graph backend asks it and does the copies.
"""

from __future__ import annotations


class Rows:
    """The rows of ``count`` slots; the engine's slots are 0 .. count-1."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.row_of: dict[int, int] = {}
        self.holding: tuple[int, int] | None = None  # the slot last prefilled and its tokens, until it decodes

    def prefilled(self, slot: int, tokens: int) -> int:
        """:meth:`take` for a prompt, or its chunk, that leaves ``slot`` with ``tokens`` in its
        cache: the slot holds its row until it decodes (module docstring)."""
        self.holding = slot, tokens
        return self.take(slot)

    def held(self, running: list[int]) -> tuple[int, int] | None:
        """The slot being prefilled and its tokens, for a decode over ``running`` (None once it decodes:
        its prompt is whole)."""
        if self.holding is not None and self.holding[0] in running:
            self.holding = None
        return self.holding

    def take(self, slot: int) -> int:
        """The row a request prefilled into ``slot`` gets: the slot's own if it has one, else the lowest free."""
        if slot not in self.row_of:
            used = set(self.row_of.values())
            self.row_of[slot] = next(row for row in range(self.count) if row not in used)
        return self.row_of[slot]

    def compact(self, running: list[int], holding: int | None = None) -> list[tuple[int, int, int]]:
        """Make the ``running`` slots hold rows 0 .. len(running)-1, ``holding`` (a slot being
        prefilled, module docstring) keeping a row past them: ``(slot, from_row, to_row)`` for each
        running request whose keys and values must move, in order, each an exchange of the two rows
        (the holding request, when it held ``to_row``, now holds ``from_row``)."""
        alive = {*running, *([] if holding is None or holding in running else [holding])}
        self.row_of = {slot: row for slot, row in self.row_of.items() if slot in alive}
        n = len(running)
        held = self.row_of.get(holding) if holding not in running else None
        free = sorted(set(range(n)) - {row for slot, row in self.row_of.items() if slot != holding or held is None})
        moves = []
        for slot in running:
            if self.row_of[slot] >= n:
                moves.append((slot, self.row_of[slot], free.pop(0)))
                self.row_of[slot] = moves[-1][2]
                if moves[-1][2] == held:
                    self.row_of[holding] = moves[-1][1]
        return moves
