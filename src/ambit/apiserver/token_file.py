"""Static tokens, as kube-apiserver's ``--token-auth-file`` reads them: one CSV line per token.

Format (kube's): ``token,user,uid[,"group1,group2,..."]``; blank lines and lines starting with ``#`` are skipped.
The groups field may be quoted (CSV), so one field holds several comma-separated groups.

Rules:
1. A token is at least 16 characters (a guessable token is refused at start, not accepted quietly) and appears once.
2. ``user`` is required; ``uid`` may be empty; groups are trimmed and empty ones dropped.
3. The file must not be readable by group or others: every token in it is a credential. A file that breaks any rule
   is refused as a whole with the line number, so a server never starts on half of it.
"""

from __future__ import annotations

import csv
import hmac
import io
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ambit.errors import AmbitError

MIN_TOKEN_LENGTH = 16


class TokenFileError(AmbitError):
    """The token file cannot be used; the message names the line."""


@dataclass(frozen=True, slots=True)
class StaticUser:
    username: str
    uid: str
    groups: tuple[str, ...]


def parse_token_file(text: str) -> dict[str, StaticUser]:
    """Token -> user (rules 1 and 2)."""
    users: dict[str, StaticUser] = {}
    try:
        rows = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as exc:
        raise TokenFileError(f"not a CSV file: {exc}") from None
    for number, row in enumerate(rows, start=1):
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        if len(row) < 3:
            raise TokenFileError(f"line {number}: expected token,user,uid[,groups], got {len(row)} fields")
        token, user, uid = (field.strip() for field in row[:3])
        if len(token) < MIN_TOKEN_LENGTH:
            raise TokenFileError(f"line {number}: the token is shorter than {MIN_TOKEN_LENGTH} characters")
        if not user:
            raise TokenFileError(f"line {number}: the user is empty")
        if token in users:
            raise TokenFileError(f"line {number}: the token appears twice")
        groups = tuple(g.strip() for field in row[3:] for g in field.split(",") if g.strip())
        users[token] = StaticUser(user, uid, groups)
    return users


def load_token_file(path: Path) -> dict[str, StaticUser]:
    """Read and parse ``path`` (rule 3 first)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise TokenFileError(f"cannot open the token file {path}: {exc.strerror}") from None
    with os.fdopen(fd, encoding="utf-8", errors="strict") as file:
        mode = os.fstat(file.fileno()).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise TokenFileError(f"the token file {path} is readable by others (mode {stat.S_IMODE(mode):o}); use 0600")
        try:
            text = file.read()
        except UnicodeDecodeError:
            raise TokenFileError(f"the token file {path} is not UTF-8") from None
    return parse_token_file(text)


def find_user(users: Mapping[str, StaticUser], token: str) -> StaticUser | None:
    """The user of ``token``, compared in constant time against every entry (no timing hint of a prefix)."""
    found: StaticUser | None = None
    presented = token.encode()
    for known, user in users.items():
        if hmac.compare_digest(known.encode(), presented):
            found = user
    return found
