"""Commands whose command line argparse reads from a table of flags, as click would read their typer declaration.

Theory of operation. The long-running processes of pods (``ambit nodeproxy``, ``ambit waypoint proxy``, ``ambit
gateway``) are handed to an argparse ``main`` by ``ambit``'s entry point (:data:`ambit.cli.main.ARGPARSE_COMMANDS`)
before typer is imported, so typer, click and rich stay out of their memory. Each command has one table of
:class:`Flag` (its module's ``FLAGS``) and a ``start(**flags)`` that checks them and runs; :func:`build_parser` turns
the table into a parser and :func:`run_command` parses, starts and maps the outcome to an exit status. Each also
keeps a typer declaration, so ``ambit --help`` lists it; the tests hold the two to the same flags, help, defaults,
environment variables and parsed values.

Rules (as click reads a typer declaration):

1. Long options only, never abbreviated (``allow_abbrev=False``); ``--x VALUE`` and ``--x=VALUE``; the last one given
   wins, except a repeatable flag, whose values are kept in order. A value that begins with ``-`` (other than a
   negative number) is given as ``--x=VALUE``: argparse reads ``--x -v`` as a flag without its value.
2. An ``int`` flag is read with ``int()`` and checked against its bounds; a bad one is a usage error (exit 2).
3. A flag with ``envvar`` takes the variable's value when the flag is absent; an empty variable counts as unset. A
   required flag whose variable is set is not required.
4. A boolean flag is a pair, ``--x`` / ``--no-x``, or, declared ``negatable=False``, the switch ``--x`` alone (typer's
   ``Option("--x")`` on a bool); its variable is read as click reads a boolean (``1``, ``true``,
   ``yes``, ``on``...; a word outside those is a usage error).
5. Exit statuses: 0 when the command ends or after ``--help``; 2 for a usage error (a bad or missing flag, or
   :class:`UsageError` from the command's own checks); 1 for :class:`CommandFailed` or Ctrl-C before the command
   handles signals (``Aborted!``, click's word). Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CommandFailed", "Flag", "UsageError", "build_parser", "run_command"]


class UsageError(Exception):
    """A flag's value is refused (exit status 2); ``flag`` names it when one flag is at fault."""

    def __init__(self, message: str, flag: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.flag = flag


class CommandFailed(Exception):
    """The command cannot run (exit status 1), for a reason its message says."""


_TRUE = frozenset({"1", "true", "t", "yes", "y", "on"})
_FALSE = frozenset({"0", "false", "f", "no", "n", "off"})


@dataclass(frozen=True, slots=True)
class Flag:
    """One option of a command."""

    name: str
    """The long option (``--node``); for a boolean, the name that sets True (``--no-`` + the rest sets False)."""
    dest: str
    """The keyword it is passed to the command as."""
    help: str
    kind: type = str
    """``str``, ``int``, ``bool`` or ``Path``."""
    default: object = None
    required: bool = False
    metavar: str | None = None
    envvar: str | None = None
    repeatable: bool = False
    minimum: int | None = None
    maximum: int | None = None
    negatable: bool = True
    """For a boolean: whether ``--no-`` + the rest is a flag too (rule 4)."""

    def __post_init__(self) -> None:
        if self.repeatable and self.envvar is not None:  # click would split the variable's value on spaces
            raise ValueError(f"{self.name}: a repeatable flag has no environment variable here")

    @property
    def names(self) -> tuple[str, ...]:
        """Every option string of the flag."""
        if self.kind is bool and self.negatable:
            return (self.name, "--no-" + self.name.removeprefix("--"))
        return (self.name,)

    def convert(self, raw: str) -> object:
        """``raw`` as the flag's value (rules 2 and 4); argparse turns a ValueError into a usage error naming the
        flag."""
        if self.kind is Path:
            return Path(raw)
        if self.kind is bool:
            word = raw.strip().lower()
            if word in _TRUE or word in _FALSE:
                return word in _TRUE
            raise argparse.ArgumentTypeError(f"{raw!r} is not a valid boolean")
        if self.kind is int:
            value = int(raw)
            low = "" if self.minimum is None else f"{self.minimum}<="
            high = "" if self.maximum is None else f"<={self.maximum}"
            if (self.minimum is not None and value < self.minimum) or (
                self.maximum is not None and value > self.maximum
            ):
                raise argparse.ArgumentTypeError(f"{value} is not in the range {low}x{high}")
            return value
        return raw


def build_parser(
    prog: str, description: str, flags: Sequence[Flag], environ: Mapping[str, str] | None = None
) -> argparse.ArgumentParser:
    """The argparse parser of ``flags``; defaults of flags with an ``envvar`` come from ``environ`` (rule 3).

    A variable's value is converted here, so a bad one is a usage error naming the variable."""
    environ = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(
        prog=prog,
        usage="%(prog)s [OPTIONS]",
        description=description,
        allow_abbrev=False,
        add_help=False,  # click's --help alone, no -h
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--help", action="help", help="Show this message and exit.")
    for flag in flags:
        default = flag.default
        required = flag.required
        help_text = flag.help
        if flag.envvar is not None:
            help_text += f" [env var: {flag.envvar}]"
            from_env = environ.get(flag.envvar)
            if from_env:
                try:
                    default = flag.convert(from_env)
                except (ValueError, argparse.ArgumentTypeError) as exc:
                    parser.error(f"invalid value for {flag.envvar} ({flag.name}): {exc}")
                required = False
        if flag.default not in (None, "") and flag.kind is not bool:
            help_text += f" [default: {flag.default}]"
        if flag.kind is bool and not flag.negatable:
            parser.add_argument(
                flag.name, dest=flag.dest, action="store_const", const=True, default=default, help=help_text
            )
            continue
        if flag.kind is bool:
            parser.add_argument(
                flag.name,
                dest=flag.dest,
                action=argparse.BooleanOptionalAction,
                default=default,
                help=f"{help_text} [default: {flag.name if flag.default else flag.names[1]}]",
            )
            continue
        parser.add_argument(
            flag.name,
            dest=flag.dest,
            type=_converter(flag),
            default=default,
            required=required,
            metavar=flag.metavar or flag.kind.__name__.upper(),
            action="append" if flag.repeatable else "store",
            help=help_text + (" [required]" if flag.required else ""),
        )
    return parser


def run_command(
    parser: argparse.ArgumentParser, start: Callable[..., None], argv: Sequence[str], failure_prefix: str
) -> int:
    """Parse ``argv`` with ``parser``, call ``start`` with the flags, and return the exit status (rule 5); a
    :class:`CommandFailed` is printed after ``failure_prefix``."""
    options = parser.parse_args(list(argv))  # exits 2 on a usage error, 0 after --help
    try:
        start(**vars(options))
    except UsageError as exc:
        parser.error(f"invalid value for '{exc.flag}': {exc.message}" if exc.flag else exc.message)
    except CommandFailed as exc:
        print(f"{failure_prefix}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("Aborted!", file=sys.stderr)
        return 1
    return 0


def _converter(flag: Flag) -> Callable[[str], object]:
    """``flag.convert`` under the kind's name, which argparse's errors show (``invalid int value: 'x'``)."""

    def convert(raw: str) -> object:
        return flag.convert(raw)

    convert.__name__ = flag.kind.__name__
    return convert
