"""Lists as users type them: one rule for every option that takes a list.

A list is written ``a,b,c``, what a user types first, or ``[a, b, c]``, the form a YAML or
JSON config holds and jsonargparse prints. Blanks around an item are dropped, and so is an
empty item: ``fp16, bf16,`` is ``[fp16, bf16]`` and ``''`` or ``[]`` is the empty list. Items
keep no quotes: ``['fp16', "bf16"]`` is ``[fp16, bf16]``.

* :func:`parse_list` is the rule, for code that takes a list as a string
  (``EmbarkStrategy(allow="fp16,bf16")``, a config's ``dense_arch="512,256"``);
* :func:`list_option` is the rule as an argparse ``type=``, for the commands;
* :func:`comma_lists` lets a jsonargparse parser (``LightningCLI``) take comma lists: it
  rewrites ``--data.dense C15,C16`` as ``--data.dense '[C15, C16]'`` for every option
  typed as a list of plain values, since jsonargparse reads a list only in brackets.
"""

from __future__ import annotations

import argparse
import collections.abc
import json
import re
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from lightning_embark.errors import ConfigError

T = TypeVar("T")

_QUOTES = ("'", '"')
#: What a YAML flow item may not hold unquoted (it would read as a mapping, a comment, ...).
_YAML_SPECIAL = re.compile(r"[:#{}\[\]&*!|>'\"%@`,]|^\s|\s$|^-\s")
#: Values a list option keeps as typed besides a bracketed list: YAML's words for None.
_LEFT_AS_TYPED = ("null", "none", "~")
_SEQUENCES = (
    list,
    tuple,
    set,
    frozenset,
    collections.abc.Sequence,
    collections.abc.MutableSequence,
    collections.abc.Set,
)
_SCALARS = (int, float, str, bool)


def list_items(text: str) -> list[str]:
    """The items of ``text`` (``a,b`` or ``[a, b]``), blanks and quotes dropped, empty
    items left out."""
    body = text.strip()
    if body.startswith("[") and body.endswith("]"):
        body = body[1:-1]
    items = []
    for item in body.split(","):
        item = item.strip()
        if len(item) >= 2 and item[0] == item[-1] and item[0] in _QUOTES:
            item = item[1:-1].strip()
        if item:
            items.append(item)
    return items


def parse_list(
    value: str | Iterable[Any],
    item: Callable[[str], T] = str,  # type: ignore[assignment]  # str is a Callable[[str], str]
    *,
    what: str,
) -> tuple[T, ...]:
    """``value`` as a tuple of ``item(...)``: a string by :func:`list_items`, any other
    iterable item by item (its items already typed, as a config's list holds them).

    Args:
        value: ``"a,b"``, ``"[a, b]"`` or a sequence.
        item: Each string item's type (``int``, ``float``, an enum, a checking function).
        what: The option or argument, for the error (``--allow``, ``dense_arch``).

    Raises:
        ConfigError: an item ``item`` refuses, named with the whole value.
    """
    if not isinstance(value, str):
        return tuple(value)
    out = []
    for part in list_items(value):
        try:
            out.append(item(part))
        except (ValueError, TypeError) as error:
            detail = f": {error}" if isinstance(error, ConfigError) else ""
            raise ConfigError(
                f"{what} {value!r}: item {part!r} is not {_kind(item)}{detail}; write a comma "
                "list such as a,b,c"
            ) from None
    return tuple(out)


def _kind(item: Callable[..., Any]) -> str:
    """What ``item`` makes, for an error: ``an integer``, ``a valid Compression``."""
    if item is int:
        return "an integer"
    if item is float:
        return "a number"
    return f"a valid {getattr(item, '__name__', 'item')}"


def list_option(
    item: Callable[[str], T] = str,  # type: ignore[assignment]  # str is a Callable[[str], str]
) -> Callable[[str], tuple[T, ...]]:
    """The list rule as an argparse ``type=``: ``--allow fp16,bf16`` gives
    ``("fp16", "bf16")``; a string default goes through it too, as argparse does.

    A bad item is a usage error naming the flag (argparse adds it) and the item.
    """

    def parse(text: str) -> tuple[T, ...]:
        try:
            return parse_list(text, item, what="list")
        except ConfigError as error:
            raise argparse.ArgumentTypeError(str(error).removeprefix("list ")) from None

    parse.__name__ = "comma list"  # argparse's "invalid comma list value" when no message
    return parse


def _list_of_values(hint: Any) -> bool:
    """Whether ``hint`` is a list of plain values (ints, strings, ...), None allowed, and
    nothing else: ``Sequence[int | str] | None`` is, ``list[int] | str`` (a string is
    taken as it is) and ``list[Callback]`` are not."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return len(args) == 1 and _list_of_values(args[0])
    if typing.get_origin(hint) not in _SEQUENCES:
        return False
    items = [a for a in args if a is not Ellipsis]
    flat = [
        t
        for a in items
        for t in (
            typing.get_args(a)
            if typing.get_origin(a) in (typing.Union, types.UnionType, typing.Literal)
            else (a,)
        )
    ]
    return bool(flat) and all(t in _SCALARS or not isinstance(t, type) for t in flat)


def _list_flags(parser: Any) -> set[str]:
    """The flags of ``parser`` (and its subcommands') that take a list of plain values."""
    flags: set[str] = set()
    for action in getattr(parser, "_actions", ()):
        if _list_of_values(getattr(action, "_typehint", None)):
            flags.update(o for o in action.option_strings if not o.endswith("+"))
        for sub in getattr(action, "_name_parser_map", {}).values():
            flags |= _list_flags(sub)
    return flags


def _flow_list(text: str) -> str:
    """``a, b`` as the YAML flow list ``[a, b]``; an item YAML would misread is quoted."""
    if text.strip().startswith("[") or text.strip().lower() in _LEFT_AS_TYPED:
        return text
    items = [json.dumps(i) if _YAML_SPECIAL.search(i) else i for i in list_items(text)]
    return "[" + ", ".join(items) + "]"


def comma_lists(parser: Any, args: Sequence[str]) -> list[str]:
    """``args`` with every value of a list-of-values option of the jsonargparse ``parser``
    written as a YAML flow list: ``--data.dense C15,C16`` (or ``=C15,C16``) becomes
    ``--data.dense [C15, C16]``, which jsonargparse reads as ``'[C15, C16]'``: the items
    then parse as inside brackets (``1,2`` are the indices 1 and 2). A bracketed value, a
    ``null`` and the options that take a string too (``--trainer.devices 0,1``) are left
    as typed.
    """
    flags = _list_flags(parser)
    out: list[str] = []
    rewrite_next = False
    for arg in args:
        if rewrite_next:
            out.append(_flow_list(arg))
            rewrite_next = False
            continue
        flag, equals, value = arg.partition("=")
        if flag in flags and equals:
            out.append(f"{flag}={_flow_list(value)}")
        else:
            out.append(arg)
            rewrite_next = arg in flags
    return out
