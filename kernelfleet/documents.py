"""Reading and writing the documents kernelfleet writes (programs, captures, cost tables, plans, ...).

Every document is a typed model (STYLE rule 14): a pydantic dataclass (:func:`model`,
:func:`document`) whose one definition gives validation with field paths, typed attributes and
the JSON Schema published under ``docs/schemas/`` (``kernelfleet.schemas``). Every document names
its kind and format version in one key, a field of the model; an older version is upgraded
before validation. Anything wrong while reading one — bad JSON, a missing, mistyped or
out-of-range field, NaN where a finite number belongs — becomes one UsageError that names the
file and the field path; building one in code with a bad value raises the same kind of error.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import json
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar, Literal, TypeVar

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)
from pydantic.dataclasses import dataclass as pydantic_dataclass

from kernelfleet.errors import UsageError

T = TypeVar("T")
D = TypeVar("D", bound="Document")

# extra keys are errors (a typo is not silently ignored), floats are finite
CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False)
Rate = Annotated[float, Field(gt=0, strict=True)]  # a positive number of something per second (not a bool)
_FILE = {"file": True}  # validation context: reading a file, so a missing version key is an error
_DOCUMENTS: dict[str, type] = {}  # schema file stem -> document class, filled by @document
_MESSAGES = {"unexpected_keyword_argument": "unknown field", "extra_forbidden": "unknown field"}
_NO_INPUT = ("missing", "json_invalid", *_MESSAGES)  # errors whose input says nothing more


def read_text(path: str | Path, what: str = "text") -> str:
    """The file's text, gunzipped when its name ends in ``.gz``; UsageError naming the file when it
    cannot be read, or is not ``what`` (a gzip stream cut short, bytes that are not UTF-8)."""
    try:
        if str(path).endswith(".gz"):
            return gzip.decompress(Path(path).read_bytes()).decode()
        return Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read {what} ({exc.strerror or exc})") from exc
    except (EOFError, UnicodeDecodeError, gzip.BadGzipFile) as exc:
        raise UsageError(f"{path}: not {what} ({exc})") from exc


def one_line(exc: ValidationError, what: str, file: bool, version_key: str | None = None) -> str:
    """The first error of ``exc`` in one line: ``<what>: field.path: message`` for a check of our
    own, ``not a <what>: field.path: message`` for pydantic's (a wrong type, a missing field) when
    reading a ``file``. A wrong ``version_key`` goes first: it explains all the others."""
    errors = sorted(exc.errors(include_url=False), key=lambda e: e["loc"] != (version_key,))
    first = errors[0]
    path = ".".join(str(part) for part in first["loc"])
    ours = first["type"] == "value_error"
    message = str(first["ctx"]["error"]) if ours else _MESSAGES.get(first["type"], first["msg"])
    if not ours and "input" in first and ", got" not in message and first["type"] not in _NO_INPUT:
        message += f", got {_short(first['input'])}"
    more = f" ({len(errors) - 1} more error{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return f"{what if ours or not file else 'not a ' + what}: {path + ': ' if path else ''}{message}{more}"


def one_of(name: str, values: tuple[str, ...]) -> Any:
    """A string field that must be one of ``values``: an enum in the schema, and an error that
    says ``<name> must be one of (...)``."""

    def check(value: str) -> str:
        if value not in values:
            raise ValueError(f"{name} must be one of {values}, got {value!r}")
        return value

    return Annotated[str, AfterValidator(check), WithJsonSchema({"type": "string", "enum": list(values)})]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@functools.cache
def adapter(cls: type[T]) -> TypeAdapter[T]:
    """The (cached) pydantic adapter that validates and dumps ``cls``."""
    return TypeAdapter(cls)


def model(what: str, **options: Any) -> Callable[[type[T]], type[T]]:
    """A pydantic dataclass (``options``: ``frozen``, ``slots``, ...) under :data:`CONFIG` whose
    construction in code raises the one-line UsageError a bad file gives, prefixed with ``what``
    (``ValidationError`` stays inside; callers get our errors)."""

    def wrap(cls: type[T]) -> type[T]:
        cls = pydantic_dataclass(config=CONFIG, **options)(cls)
        init = cls.__init__
        positional = [f.name for f in dataclasses.fields(cls) if not f.kw_only]  # type: ignore[arg-type]

        @functools.wraps(init)
        def checked_init(self: Any, *args: Any, **kwargs: Any) -> None:
            try:
                init(self, *args, **kwargs)
            except ValidationError:
                try:  # again by name, so that the error names the field, not the argument's position
                    init(self, **dict(zip(positional, args)), **kwargs)
                except ValidationError as exc:
                    raise UsageError(one_line(exc, what, file=False)) from None
                raise

        cls.__init__ = checked_init  # type: ignore[method-assign]
        cls.__what__ = what  # type: ignore[attr-defined]
        return cls

    return wrap


def document(key: str, version: int, what: str,
             upgrades: dict[int | None, Callable[[Any], dict[str, Any]]] | None = None,
             **options: Any) -> Callable[[type[T]], type[T]]:
    """A :func:`model` that is a whole document, whose format version is the field ``key``.

    The field is added here, first and keyword-only (``Literal[version]``; built in code, it is
    ``version``). Reading a file (:func:`load`) checks it: ``version`` passes; an older version
    ``v`` in ``upgrades`` (``None``: a document from before it had the key) is first rewritten by
    ``upgrades[v]`` (the parsed JSON in, a dict of the current shape out); anything else, a
    missing key included, is an error. The schema is
    ``docs/schemas/<key without "kernelfleet_">.schema.json``.
    """

    def check_version(cls: type, value: Any, info: ValidationInfo) -> Any:
        if value is None and not (info.context or {}).get("file"):
            return version  # built in code
        if value != version:
            raise ValueError(f"expected {key}={version}" + ("" if value is None else f", got {value!r}"))
        return value

    def wrap(cls: type[T]) -> type[T]:
        cls.__annotations__ = {key: Literal[version] | None, **cls.__annotations__}  # type: ignore[valid-type]
        setattr(cls, key, Field(None, validate_default=True, kw_only=True, repr=False))
        cls._check_version = field_validator(key, mode="before")(classmethod(check_version))  # type: ignore[attr-defined]
        cls = model(what, **options)(cls)
        cls.__document__ = (key, version, what, upgrades or {})  # type: ignore[attr-defined]
        _DOCUMENTS[key.removeprefix("kernelfleet_")] = cls
        return cls

    return wrap


def load(cls: type[T], text: str | bytes, where: str) -> T:
    """The document of type ``cls`` in the JSON ``text``; one UsageError naming ``where`` otherwise.

    The current version validates straight from the JSON text (pydantic's parser, the fast path);
    an older one, in the document's ``upgrades``, is parsed, upgraded, then validated."""
    key, version, what, upgrades = cls.__document__  # type: ignore[attr-defined]
    try:
        try:
            return adapter(cls).validate_json(text, context=_FILE)
        except ValidationError as exc:
            try:
                doc = json.loads(text) if upgrades else None
            except ValueError:
                raise exc from None
            # None: a document from before the key (not an object); an object without it is wrong
            old = doc.get(key, "missing") if isinstance(doc, dict) else None
            if doc is None or old == version or old not in upgrades:
                raise
        return adapter(cls).validate_python({**upgrades[old](doc), key: version}, context=_FILE)
    except ValidationError as exc:
        raise UsageError(f"{where}: {one_line(exc, what, file=True, version_key=key)}") from None


def validate(cls: type[T], data: Any, where: str) -> T:
    """``data`` (parsed from a file, e.g. TOML or JSON) as a :func:`model` ``cls``; one UsageError
    naming ``where`` and the field otherwise."""
    try:
        return adapter(cls).validate_python(data, context=_FILE)
    except ValidationError as exc:
        raise UsageError(f"{where}: {one_line(exc, cls.__what__, file=True)}") from None  # type: ignore[attr-defined]


class Document:
    """What every :func:`document` class offers: ``to_json``, ``save``, ``from_json``, ``load``.

    ``DUMP`` holds the class's pydantic dump options (``indent``; ``exclude_none`` or
    ``exclude_defaults`` to leave out what reads back the same)."""

    DUMP: ClassVar[dict[str, Any]] = {}

    def to_json(self) -> str:
        return adapter(type(self)).dump_json(self, **self.DUMP).decode()

    def save(self, path: str | Path) -> None:
        """Write the document, gzipped when the name ends in ``.gz``."""
        data = self.to_json().encode()
        Path(path).write_bytes(gzip.compress(data, mtime=0) if str(path).endswith(".gz") else data)

    @classmethod
    def from_json(cls: type[D], text: str | bytes, where: str | None = None) -> D:
        """Read ``to_json`` output (any version the class reads); a malformed document is one
        UsageError naming ``where`` and the field that is wrong."""
        return load(cls, text, where or f"<{cls.__document__[2]}>")  # type: ignore[attr-defined]

    @classmethod
    def load(cls: type[D], path: str | Path) -> D:
        """Read a file (gunzipped when its name ends in ``.gz``)."""
        return cls.from_json(read_text(path, f"a {cls.__document__[2]}"), str(path))  # type: ignore


def registered() -> dict[str, type]:
    """The :func:`document` classes imported so far, by schema file stem (``kernelfleet.schemas``
    imports them all)."""
    return dict(sorted(_DOCUMENTS.items()))
