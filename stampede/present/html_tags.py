"""The HTML report's two building blocks: an element, escaped attributes, and a table
that scrolls sideways on a narrow screen rather than overflowing its box."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape


def tag(name: str, content: str, **attributes: str) -> str:
    extra = "".join(f' {key.rstrip("_")}="{escape(value)}"' for key, value in attributes.items())
    return f"<{name}{extra}>{content}</{name}>"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(tag("th", escape(h)) for h in headers)
    body = "".join(tag("tr", "".join(tag("td", escape(c)) for c in row)) for row in rows)
    return tag("div", tag("table", tag("thead", tag("tr", head)) + tag("tbody", body)), class_="scroll")
