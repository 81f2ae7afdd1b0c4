"""istioctl's boolean flags, read the way its argument parser (cobra with pflag) reads them, for click.

Rules (pure: argument words in, argument words out; nothing else is changed):

1. A boolean flag alone (``--wait``) is true, as in click.
2. ``--flag=VALUE`` sets the flag to VALUE, where VALUE is one of Go's ``strconv.ParseBool`` words (``1 t T TRUE
   true True`` and ``0 f F FALSE false False``): it becomes ``--flag`` or ``--no-flag`` (the command declares
   both). ``-w=false`` works the same for a short flag. Any other VALUE is left as it is, for click to refuse.
3. ``--flag true`` and ``--flag false``: pflag takes a boolean flag's value only after ``=``, so istioctl keeps the
   word as a positional argument that ``waypoint apply`` ignores (its tests write ``--enroll-namespace true``).
   Click would refuse the stray word; here the word right after a boolean flag becomes that flag's value. For
   ``true`` the outcome is istioctl's; for ``false`` it is what the words say, where istioctl would set the flag.
4. Everything after ``--`` is left alone: there are only positional arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ambit.errors import AmbitError

TRUE_WORDS = frozenset({"1", "t", "T", "TRUE", "true", "True"})
FALSE_WORDS = frozenset({"0", "f", "F", "FALSE", "false", "False"})
FOLLOWING_WORDS = {"true": True, "false": False}
"""The words rule 3 reads as a flag's value (the upstream tests' spelling)."""


class BoolFlagError(AmbitError):
    """A boolean flag was given a value that is not a boolean (``--wait=soon``)."""


def read_bool_flags(args: Sequence[str], flags: Mapping[str, str]) -> list[str]:
    """``args`` with istioctl's boolean flag spellings turned into click's.

    ``flags`` maps each spelling of a boolean flag (``--wait``, ``-w``) to its long name (``--wait``); the
    negative is ``--no-`` plus the long name without its dashes.
    """
    out: list[str] = []
    i = 0
    while i < len(args):
        word = args[i]
        i += 1
        if word == "--":
            out.append(word)
            out.extend(args[i:])
            break
        spelling, equals, value = word.partition("=")
        long_name = flags.get(spelling)
        if long_name is None:
            out.append(word)
        elif equals:
            if value in TRUE_WORDS:
                out.append(long_name)
            elif value in FALSE_WORDS:
                out.append(_negative(long_name))
            else:
                raise BoolFlagError(f"invalid argument {value!r} for {spelling!r} flag: expected true or false")
        elif i < len(args) and args[i] in FOLLOWING_WORDS:
            out.append(long_name if FOLLOWING_WORDS[args[i]] else _negative(long_name))
            i += 1
        else:
            out.append(long_name)
    return out


def _negative(long_name: str) -> str:
    return "--no-" + long_name.removeprefix("--")
