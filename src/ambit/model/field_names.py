"""HTTP field names: the one definition of RFC 9110's ``token`` that every checker of a header name uses.

A field name (and a method, and a parameter name) is a ``token`` (RFC 9110 §5.1, §5.6.2): one or more ``tchar``,
the visible ASCII characters that are not delimiters, i.e. letters, digits and ``!#$%&'*+-.^_`|~``. Nothing else:
no space, no control character (a CR or LF would end the header on an HTTP/1.1 wire), no ``:`` (a pseudo-header is
HTTP/2's, never a configured name), nothing outside ASCII.

HTTP/1.1 compares names case-insensitively; HTTP/2 and HTTP/3 send them lower case only, and a field block with an
upper-case name is malformed (RFC 9113 §8.2.1), so the wire checks use :data:`LOWER_TOKEN` and
:data:`LOWER_TOKEN_BYTES`.

Rules:

1. :data:`TCHARS` lists the characters, :data:`TCHAR_BYTES` holds them as byte values (for scanners that step
   through bytes), and the patterns spell the same class with ranges (the unit tests hold them to one another).
2. The patterns are unanchored: use them with ``fullmatch`` (or :func:`is_token`). Never with ``match`` and a
   ``$``, which also accepts a trailing newline.
"""

from __future__ import annotations

import re
import string

__all__ = ["LOWER_TOKEN", "LOWER_TOKEN_BYTES", "TCHARS", "TCHAR_BYTES", "TOKEN", "is_token"]

_SYMBOLS = "!#$%&'*+-.^_`|~"
TCHARS = _SYMBOLS + string.digits + string.ascii_letters
TCHAR_BYTES = frozenset(TCHARS.encode("ascii"))

TOKEN = re.compile(f"[{re.escape(_SYMBOLS)}0-9A-Za-z]+")
"""A token in any case: HTTP/1.1 names, methods, configured names that are lower-cased later."""
LOWER_TOKEN = re.compile(f"[{re.escape(_SYMBOLS)}0-9a-z]+")
"""A token without upper-case letters: an HTTP/2 field name."""
LOWER_TOKEN_BYTES = re.compile(LOWER_TOKEN.pattern.encode("ascii"))
""":data:`LOWER_TOKEN` for names still in bytes, as HPACK decodes them."""


def is_token(name: str) -> bool:
    """Whether ``name`` is a whole token (any case)."""
    return TOKEN.fullmatch(name) is not None
