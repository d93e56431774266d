"""Database URLs made safe for messages: the password masked, without loading SQLAlchemy.

Every text dippm-nas writes about a store (a warning, a log record, an exception, a ``repr``) names its URL
through :func:`redact_url`; a message that quotes a driver's or a parser's own error goes through
:func:`scrub` as well, which masks the URL's password wherever it appears in the text. A URL's password is
the part between ``user:`` and ``@`` of its authority, as SQLAlchemy parses it (``[^@]*`` after the colon),
and the values of the query parameters that carry one (:data:`SECRET_QUERY_KEYS`, e.g. psycopg2's
``?password=``).
"""

from __future__ import annotations

import re
from urllib.parse import unquote

__all__ = ["MASK", "SECRET_QUERY_KEYS", "redact_url", "scrub", "url_secrets"]

#: What stands for a password in a message (SQLAlchemy's own mask).
MASK = "***"
#: Query parameters whose values are secrets (case-insensitive).
SECRET_QUERY_KEYS = ("password", "passwd", "pwd", "secret", "token", "sslpassword", "sslkey")

#: ``scheme://user:PASSWORD@``: the password stops at the last ``@`` before any query (a password holding an
#: unescaped ``@`` is masked whole; a path holding one is masked too, which is safe).
_USERINFO = re.compile(r"^(?P<head>[A-Za-z][\w+.\-]*://[^:/?#@]*):(?P<password>[^?#]*)@")
_QUERY_SECRET = re.compile(r"(?P<head>[?&](?:" + "|".join(SECRET_QUERY_KEYS) + r")=)(?P<value>[^&#]*)", re.I)


def _text_of(url: object) -> str:
    """The URL as text, password included (a SQLAlchemy ``URL`` rendered with it, anything else ``str``)."""
    render = getattr(url, "render_as_string", None)
    if callable(render):
        try:
            return str(render(hide_password=False))
        except Exception:  # noqa: BLE001 - an object that only looks like a URL: its plain text
            pass
    return url if isinstance(url, str) else str(url)


def url_secrets(url: object) -> list[str]:
    """The secrets a URL holds (its password, as written and percent-decoded, and the values of its
    :data:`SECRET_QUERY_KEYS`), longest first; ``[]`` when it holds none."""
    text = _text_of(url)
    found: set[str] = set()
    m = _USERINFO.match(text)
    if m and m.group("password"):
        found.update((m.group("password"), unquote(m.group("password"))))
    for q in _QUERY_SECRET.finditer(text):
        if q.group("value"):
            found.update((q.group("value"), unquote(q.group("value"))))
    return sorted((s for s in found if s), key=len, reverse=True)


def redact_url(url: object) -> str:
    """``url`` (a string or a SQLAlchemy ``URL``) as text with its password and secret query values masked
    (:data:`MASK`), safe for messages. Text that is not a URL comes back unchanged, less any secret."""
    text = _text_of(url)
    text = _USERINFO.sub(lambda m: f"{m.group('head')}:{MASK}@", text, count=1)
    return _QUERY_SECRET.sub(lambda m: f"{m.group('head')}{MASK}", text)


def scrub(text: str, *urls: object) -> str:
    """``text`` with every secret of ``urls`` (:func:`url_secrets`) replaced by :data:`MASK`: for messages that
    quote another library's error about a URL."""
    for url in urls:
        if url is None:
            continue
        for secret in url_secrets(url):
            text = text.replace(secret, MASK)
    return text
