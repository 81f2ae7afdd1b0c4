"""Running a per-node daemon's command straight from its arguments, without typer's parsing on the happy path.

Theory of operation: typer coerces every parameter through a pydantic ``TypeAdapter``, so parsing a command line
imports pydantic and builds an adapter per option, which a long-running daemon then keeps for its whole life only to
have read a few strings once. For the commands in :data:`ambit.cli.main.DIRECT_COMMANDS`
(the node proxy: one per node, restarted on every hand-over), :func:`run_direct` reads the command's own
declaration (its typer ``Annotated`` options) into a :class:`CommandSpec` and parses the arguments itself. It
handles only what it is sure of and otherwise declines, and the caller runs the command through typer as before,
so every error a user sees is typer's, worded as always.

Rules:

1. Only parameters declared as long options of type ``str``, ``int``, ``bool`` (a ``--x/--no-x`` pair), ``Path``,
   their ``| None`` forms, and ``list[str] | None`` (repeatable) are understood; ``min``/``max`` and one ``envvar``
   are honoured, as click does (an empty variable counts as unset). A command with anything else (a callback, an
   eager option, a prompt, path checks, a custom parser, an argument) gets no spec: typer always parses it.
2. Declined, and left to typer: ``--help`` and anything not a declared option, a missing value, a value given as
   the next argument that starts with ``-``, a value that does not convert (an ``int`` that is not decimal digits,
   an empty path) or is out of range.
3. The command's own checks of its arguments raise ``typer.BadParameter`` before they have any effect; such an
   error is declined too, so typer parses again and reports it (the checks run twice only on bad input).
4. ``typer.Exit(code)`` exits with ``code``; a return exits 0; Ctrl-C before the command handles signals exits 1
   with click's ``Aborted!``. Any other exception propagates: Python prints its traceback and the status is 1, as
   under typer (whose traceback is formatted by rich).
"""

from __future__ import annotations

import inspect
import os
import sys
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from typer.models import OptionInfo

__all__ = ["CommandSpec", "OptionSpec", "command_spec", "parse_direct", "run_direct"]

_UNSUPPORTED = ("callback", "is_eager", "prompt", "exists", "resolve_path", "count", "parser", "click_type")
"""OptionInfo attributes that mean more than a plain value (rule 1): set, the command is left to typer."""


@dataclass(frozen=True, slots=True)
class OptionSpec:
    """One option of a command, as :func:`parse_direct` reads it."""

    param: str
    """The function's parameter name."""
    kind: type
    """``str``, ``int``, ``bool`` or ``Path``."""
    multiple: bool = False
    flag_value: bool | None = None
    """For a flag: the value its name sets (``--x`` True, ``--no-x`` False)."""
    minimum: int | None = None
    maximum: int | None = None
    envvar: str | None = None

    def convert(self, raw: str) -> object | None:
        """``raw`` as this option's value, or None when the parser is not sure of it (rule 2)."""
        if self.kind is str:
            return raw
        if self.kind is Path:
            return Path(raw) if raw else None
        if self.kind is int:
            digits = raw[1:] if raw.startswith("-") else raw
            if not (digits.isascii() and digits.isdigit()):
                return None
            value = int(raw)
            if (self.minimum is not None and value < self.minimum) or (
                self.maximum is not None and value > self.maximum
            ):
                return None
            return value
        return None


@dataclass(frozen=True, slots=True)
class CommandSpec:
    """A command's options by every name they can be given under, and its parameters' defaults."""

    names: dict[str, OptionSpec]
    defaults: dict[str, Any]


def command_spec(function: Callable[..., Any]) -> CommandSpec | None:
    """The spec of a typer command function, or None when it declares what rule 1 does not cover."""
    hints = typing.get_type_hints(function, include_extras=True)
    names: dict[str, OptionSpec] = {}
    defaults: dict[str, Any] = {}
    for name, parameter in inspect.signature(function).parameters.items():
        annotation = hints.get(name)
        metadata = getattr(annotation, "__metadata__", ())
        info = next((m for m in metadata if isinstance(m, OptionInfo)), None)
        if info is None or any(getattr(info, attribute, None) for attribute in _UNSUPPORTED):
            return None
        decls = list(info.param_decls or ())
        declared = [info.default, *decls] if isinstance(info.default, str) else decls
        if not declared or not all(isinstance(d, str) and d.startswith("--") for d in declared):
            return None
        kind, multiple = _kind(annotation.__origin__)  # type: ignore[union-attr]
        if kind is None:
            return None
        envvar = info.envvar if isinstance(info.envvar, str) else None
        if info.envvar is not None and envvar is None:
            return None
        defaults[name] = None if parameter.default is inspect.Parameter.empty else parameter.default
        if kind is bool:
            if len(declared) != 1 or declared[0].count("/") != 1 or envvar is not None:
                return None
            on, off = declared[0].split("/")
            names[on] = OptionSpec(name, bool, flag_value=True)
            names[off] = OptionSpec(name, bool, flag_value=False)
            continue
        option = OptionSpec(name, kind, multiple, None, _bound(info.min), _bound(info.max), envvar)
        for each in declared:
            if "/" in each:
                return None
            names[each] = option
    return CommandSpec(names, defaults)


def _bound(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _kind(annotation: Any) -> tuple[type | None, bool]:
    """The value type of a parameter annotation and whether the option repeats; (None, False) if unsupported."""
    args = typing.get_args(annotation)
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1 or len(args) != 2:
            return None, False
        annotation = rest[0]
        args = typing.get_args(annotation)
    if typing.get_origin(annotation) is list:
        return (str, True) if args == (str,) else (None, False)
    if annotation in (str, int, bool, Path):
        return annotation, False
    return None, False


def parse_direct(spec: CommandSpec, argv: Sequence[str]) -> dict[str, Any] | None:
    """The keyword arguments for the command, or None when the arguments are to be left to typer (rule 2)."""
    values: dict[str, Any] = {}
    index = 0
    while index < len(argv):
        name, equals, inline = argv[index].partition("=")
        option = spec.names.get(name)
        if option is None:
            return None
        if option.flag_value is not None:
            if equals:
                return None
            values[option.param] = option.flag_value
            index += 1
            continue
        if equals:
            raw, index = inline, index + 1
        elif index + 1 < len(argv) and not argv[index + 1].startswith("-"):
            raw, index = argv[index + 1], index + 2
        else:
            return None
        value = option.convert(raw)
        if value is None:
            return None
        if option.multiple:
            values.setdefault(option.param, []).append(value)
        else:
            values[option.param] = value
    for option in {id(o): o for o in spec.names.values()}.values():
        if option.envvar is None or option.param in values:
            continue
        from_env = os.environ.get(option.envvar)
        if from_env:  # click's rule: an empty variable is no value
            value = option.convert(from_env)
            if value is None:
                return None
            values[option.param] = [value] if option.multiple else value
    return spec.defaults | values


def run_direct(function: Callable[..., Any], argv: Sequence[str]) -> None:
    """Run ``function`` with ``argv`` parsed here and exit, or return (having done nothing) to leave it to typer."""
    spec = command_spec(function)
    kwargs = parse_direct(spec, argv) if spec is not None else None
    if kwargs is None:
        return
    try:
        function(**kwargs)
    except typer.BadParameter:
        return  # rule 3: typer parses again and reports it
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("Aborted!", file=sys.stderr)
        sys.exit(1)
    sys.exit(0)
