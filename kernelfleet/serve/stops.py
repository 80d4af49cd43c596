"""OpenAI's ``stop``: strings that end a completion, left out of its text.

A stop string can span tokens, and the text a token adds can end with the first characters of
one, so the text goes out through :class:`StopText`: each token's piece is what the text added,
less any end of it that could still begin a stop string (held until the next token says); once a
stop string appears, the text ends where it begins and the completion's finish reason is
``stop``. It runs on the engine's thread, called with each token before the token goes out
(``Engine.submit``'s ``watch``), so a completion stops at the token that completes the string,
not some tokens later, and its slot goes to the next request at once. Only requests with stop
strings pay for this decode on the engine's thread; the others' text is decoded by the API.
"""

from __future__ import annotations

from typing import Any

from kernelfleet.serve.stream import Detokenizer


class StopText:
    """The text of one choice through ``stops`` (non-empty strings), its pieces by token."""

    def __init__(self, tokenizer: Any, stops: list[str]) -> None:
        self.decoded = Detokenizer(tokenizer)
        self.stops = stops
        self.text = ""  # all the tokens' text so far
        self.sent = 0  # characters of it handed out in pieces
        self.pieces: list[str] = []  # what each token handed out, in order
        self.found = False

    def __call__(self, token: int, last: bool) -> bool:
        """Take ``token`` (``last``: no more come); True when the text now holds a stop string."""
        self.text += self.decoded.add(token, last)
        # what went out holds no start of a stop string (it was held), so one can only begin after it
        starts = [at for at in (self.text.find(stop, self.sent) for stop in self.stops) if at >= 0]
        if starts:
            self.found = True
            end = min(starts)
        else:
            end = len(self.text) if last else len(self.text) - self._held()
        self.pieces.append(self.text[self.sent:end])
        self.sent = max(self.sent, end)
        return self.found

    def _held(self) -> int:
        """How many of the text's last characters could be the start of a stop string."""
        for size in range(min(len(self.text) - self.sent, max(map(len, self.stops)) - 1), 0, -1):
            tail = self.text[-size:]
            if any(stop.startswith(tail) for stop in self.stops):
                return size
        return 0

    def whole(self) -> str:
        return "".join(self.pieces)
