"""The HTML pieces of the notebook cards (:mod:`workbench.views.cards`): small tables, token
strips and links into a serving dashboard. Every stored string goes through
:func:`html.escape`; only the fragments built here are trusted.

Which dashboard the links point at: ``WORKBENCH_DASHBOARD_URL`` when it is set (an empty
value turns links off); otherwise the default ``workbench dashboard`` address,
http://127.0.0.1:8050, when something answers a TCP connect there within
``PROBE_SECONDS`` (the answer is kept for ``PROBE_TTL`` seconds); otherwise no links.

Examples:
    >>> str(token_strip(["<b>", "x"]))                   # doctest: +ELLIPSIS
    '<div ...>&lt;b&gt;</span>...x</span></div>'
    >>> str(rows_table(["name"], [["<i>"]]))             # doctest: +ELLIPSIS
    '<table ...&lt;i&gt;...</table>'
"""

from __future__ import annotations

import html
import os
import socket
import time
from collections.abc import Sequence
from urllib.parse import urlsplit

DASHBOARD_ENV = "WORKBENCH_DASHBOARD_URL"
DEFAULT_DASHBOARD = "http://127.0.0.1:8050"
PROBE_SECONDS = 0.05
PROBE_TTL = 30.0
MAX_TOKENS = 96
"""A token strip shows at most this many tokens, then how many more there are."""
_probed: dict[str, tuple[float, bool]] = {}

BOX = ("display:inline-block;border:1px solid #cbd5e1;border-radius:3px;padding:0 3px;"
       "margin:1px;font-family:monospace;font-size:0.85em;white-space:pre;background:#f8fafc")
CELL = "text-align:left;padding:1px 8px;vertical-align:top"


class Safe(str):
    """A fragment of HTML built here: :func:`cell` passes it through unescaped."""


def cell(value: object) -> str:
    """A value as table-cell HTML: a :class:`Safe` fragment as it is, anything else
    escaped."""
    return value if isinstance(value, Safe) else html.escape(str(value))


def link(href: str, text: str) -> Safe:
    """An ``<a>`` opening ``href`` in a new tab (both escaped)."""
    return Safe(f'<a href="{html.escape(href)}" target="_blank">{html.escape(text)}</a>')


def code(text: object) -> Safe:
    return Safe(f"<code>{html.escape(str(text))}</code>")


def marked(text: object, why: str) -> Safe:
    """``text`` emphasised, with ``why`` on hover (a value off its default, a problem)."""
    return Safe(f'<b style="color:#b45309" title="{html.escape(why)}">'
                f"{html.escape(str(text))}</b>")


def problem(text: str) -> Safe:
    """A line saying what is wrong, in red."""
    return Safe(f'<div style="color:#b91c1c">{html.escape(text)}</div>')


def rows_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> Safe:
    """A compact table; each cell is escaped unless it is :class:`Safe`."""
    head = "".join(f'<th style="{CELL}">{html.escape(h)}</th>' for h in header)
    body = "".join("<tr>" + "".join(f'<td style="{CELL}">{cell(v)}</td>' for v in row)
                   + "</tr>" for row in rows)
    return Safe(f'<table style="border-collapse:collapse;margin:4px 0"><thead><tr>{head}'
                f"</tr></thead><tbody>{body}</tbody></table>")


def token_strip(tokens: Sequence[str], max_tokens: int = MAX_TOKENS) -> Safe:
    """Each token in a small box, its position on hover; past ``max_tokens``, a count of
    the tokens not shown."""
    boxes = "".join(f'<span style="{BOX}" title="{i}">{html.escape(t)}</span>'
                    for i, t in enumerate(tokens[:max_tokens]))
    more = len(tokens) - max_tokens
    tail = f" <i>… {more} more tokens</i>" if more > 0 else ""
    return Safe(f'<div style="line-height:1.9">{boxes}{tail}</div>')


def block(title: Safe | str, *parts: Safe | str) -> str:
    """The whole card: a heading line and its parts (plain strings are escaped)."""
    inner = "".join(p if isinstance(p, Safe) else f"<div>{html.escape(p)}</div>"
                    for p in parts)
    return (f'<div style="font-family:sans-serif;font-size:0.9em">'
            f"<div style=\"margin-bottom:4px\">{cell(title)}</div>{inner}</div>")


def dashboard_url() -> str | None:
    """The address of the dashboard to link to, or ``None`` (see the module docstring)."""
    configured = os.environ.get(DASHBOARD_ENV)
    if configured is not None:
        return configured.strip().rstrip("/") or None
    return DEFAULT_DASHBOARD if _answers(DEFAULT_DASHBOARD) else None


def _answers(url: str) -> bool:
    now = time.monotonic()
    seen = _probed.get(url)
    if seen is not None and now - seen[0] < PROBE_TTL:
        return seen[1]
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80),
                                      timeout=PROBE_SECONDS):
            up = True
    except OSError:
        up = False
    _probed[url] = (now, up)
    return up
