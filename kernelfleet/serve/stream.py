"""From the engine's thread to one HTTP request: tokens as they come, and their text.

:class:`TokenStream` is a request's ``sink``: the engine calls it on its own thread, and it hands
each ``(token_id, finish_reason)`` to the request's asyncio loop, where the handler awaits them.
:class:`Detokenizer` turns a growing list of token ids into the text each new token adds; a token
that ends inside a multi-byte character adds nothing until the character is whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

REPLACEMENT = "\ufffd"  # what decoding yields for an incomplete UTF-8 sequence


class TokenStream:
    """A request's tokens, put by the engine's thread, read with ``async for`` on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[tuple[int | None, str | None]] = asyncio.Queue()
        self.finish_reason: str | None = None

    def __call__(self, token: int | None, finish_reason: str | None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (token, finish_reason))
        except RuntimeError:  # the loop has closed: the server is stopping and nobody reads
            pass

    async def __aiter__(self) -> AsyncIterator[tuple[int | None, str | None]]:
        while self.finish_reason is None:
            token, self.finish_reason = await self.queue.get()
            yield token, self.finish_reason


class Detokenizer:
    """The text of the tokens so far, handed out piece by piece (None without a tokenizer)."""

    def __init__(self, tokenizer: Any | None) -> None:
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.sent = ""

    def add(self, token: int | None, last: bool) -> str | None:
        """The text ``token`` adds (all that is left when ``last``)."""
        if self.tokenizer is None:
            return None
        if token is not None:
            self.tokens.append(token)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if text.endswith(REPLACEMENT) and not last:
            return ""
        piece, self.sent = text[len(self.sent):], text
        return piece
