"""From the engine's thread to the HTTP requests: tokens as they come, and their text.

:class:`Outbox` is the one doorway from the engine's thread into the server's asyncio loop. Every
:class:`TokenStream` (a request's ``sink``) puts its ``(token_id, finish_reason)`` there; the outbox
wakes the loop once for everything put since its last wake, not once a token: a decode step of
``n`` streaming requests costs one ``call_soon_threadsafe`` (one write to the loop's self-pipe, one
wake of its selector), and a loop that falls behind takes a backlog in one go.

:class:`Detokenizer` turns a growing list of token ids into the text each new token adds, decoding
only a window of the last tokens (vLLM's offsets), not the whole output every token: the cost of a
token's text does not grow with the answer's length. A token that ends inside a multi-byte
character adds nothing until the character is whole.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

REPLACEMENT = "\ufffd"  # what decoding yields for an incomplete UTF-8 sequence

Item = tuple[int | None, str | None]


class Outbox:
    """Items for the streams of one asyncio ``loop``, put from any thread, delivered in batches."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._pending: list[tuple[asyncio.Queue[Item], Item]] = []
        self._scheduled = False

    def put(self, queue: asyncio.Queue[Item], item: Item) -> None:
        with self._lock:
            self._pending.append((queue, item))
            if self._scheduled:  # a wake is on its way and will take this item too
                return
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:  # the loop has closed: the server is stopping and nobody reads
            pass

    def _deliver(self) -> None:
        with self._lock:
            pending, self._pending, self._scheduled = self._pending, [], False
        for queue, item in pending:
            queue.put_nowait(item)


class TokenStream:
    """A request's tokens, put by the engine's thread, read with ``async for`` on the outbox's loop."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox
        self.queue: asyncio.Queue[Item] = asyncio.Queue()
        self.finish_reason: str | None = None

    def __call__(self, token: int | None, finish_reason: str | None) -> None:
        self.outbox.put(self.queue, (token, finish_reason))

    async def __aiter__(self) -> AsyncIterator[Item]:
        while self.finish_reason is None:
            token, self.finish_reason = await self.queue.get()
            yield token, self.finish_reason


class Detokenizer:
    """The text of the tokens so far, handed out piece by piece (None without a tokenizer)."""

    def __init__(self, tokenizer: Any | None) -> None:
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        # tokens[start:sent] is the context decoded again with each new token (a tokenizer may
        # spell a token differently at the start of a text: a leading space dropped);
        # tokens[:sent] are those whose text went out
        self.start = self.sent = 0

    def add(self, token: int | None, last: bool) -> str | None:
        """The text ``token`` adds (all that is left when ``last``)."""
        if self.tokenizer is None:
            return None
        if token is not None:
            self.tokens.append(token)
        decode = self.tokenizer.decode
        before = decode(self.tokens[self.start:self.sent], skip_special_tokens=True)
        text = decode(self.tokens[self.start:], skip_special_tokens=True)
        if text.endswith(REPLACEMENT) and not last:
            return ""
        self.start, self.sent = self.sent, len(self.tokens)
        return text[len(before):]
