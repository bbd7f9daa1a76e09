"""A report's content as a list of blocks, and the two formatters that write it: Markdown and HTML.

The report says what it says once (`report.py` builds the blocks from its numbers); these formatters decide
only how it looks, so the Markdown and the HTML cannot drift apart. Blocks hold text, never markup: the HTML
formatter escapes every string it is given, the Markdown formatter writes them as they are.

Charts are named, not drawn: the HTML formatter embeds the matplotlib figure of that name as a base64 PNG
(a self-contained page); Markdown leaves charts out, since a single .md file cannot hold an image.

Example:
    >>> to_markdown([Heading("Cost"), Paragraph(("Per epoch: ", Strong("2 USD"), "."))])
    '## Cost\\n\\nPer epoch: **2 USD**.\\n'
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from tfopt.profiling.plots import png_base64

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclasses.dataclass(frozen=True)
class Strong:
    """Words to stress: **bold** in Markdown, <b> in HTML."""

    text: str


@dataclasses.dataclass(frozen=True)
class Emphasis:
    """An aside: _italic_ in Markdown, <i> in HTML."""

    text: str


@dataclasses.dataclass(frozen=True)
class Code:
    """Something to type or a name in code: `backticks` in Markdown, <code> in HTML."""

    text: str


@dataclasses.dataclass(frozen=True)
class Arrow:
    """Leads to: "->" in Markdown (plain text stays readable), a real arrow in HTML."""


Inline = str | Strong | Emphasis | Code | Arrow
# A run of text: a plain string, or pieces of which some are stressed, set as code, ...
Text = str | tuple[Inline, ...]


@dataclasses.dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2


@dataclasses.dataclass(frozen=True)
class Paragraph:
    """A paragraph; `lead` marks the report's headline lines, which HTML sets larger."""

    text: Text
    lead: bool = False


@dataclasses.dataclass(frozen=True)
class Bullets:
    items: tuple[Text, ...]


@dataclasses.dataclass(frozen=True)
class Table:
    """A table whose first column labels its rows; `id` names it in HTML (tests and people's CSS find it)."""

    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    id: str


@dataclasses.dataclass(frozen=True)
class Chart:
    """The figure called `name` in the figures given to `to_html`."""

    name: str


@dataclasses.dataclass(frozen=True)
class Footer:
    text: str


Block = Heading | Paragraph | Bullets | Table | Chart | Footer


def to_markdown(blocks: Iterable[Block]) -> str:
    """The blocks as Markdown: one blank line between blocks, a newline at the end, charts left out."""
    rendered = (_markdown_block(block) for block in blocks)
    return "\n\n".join(text for text in rendered if text is not None) + "\n"


def to_html(blocks: Iterable[Block], figures: Mapping[str, Figure] | None = None) -> str:
    """The blocks as HTML elements, one a line, every string escaped; no document around them.

    Args:
        blocks: What to write.
        figures: Chart name -> matplotlib Figure, for each `Chart` among the blocks.

    Raises:
        ValueError: A `Chart` names a figure that `figures` lacks.
    """
    return "\n".join(_html_block(block, figures or {}) for block in blocks)


def _markdown_block(block: Block) -> str | None:
    if isinstance(block, Heading):
        return "#" * block.level + " " + block.text
    if isinstance(block, Paragraph):
        return _markdown_text(block.text)
    if isinstance(block, Bullets):
        return "\n".join("- " + _markdown_text(item) for item in block.items)
    if isinstance(block, Table):
        return "\n".join(
            [
                "| " + " | ".join(block.header) + " |",
                "|" + "---|" * len(block.header),
                *("| " + " | ".join(row) + " |" for row in block.rows),
            ]
        )
    if isinstance(block, Chart):
        return None
    return _markdown_text((Emphasis(block.text),))


def _markdown_text(text: Text) -> str:
    return "".join(_markdown_inline(piece) for piece in ((text,) if isinstance(text, str) else text))


def _markdown_inline(piece: Inline) -> str:
    if isinstance(piece, Strong):
        return f"**{piece.text}**"
    if isinstance(piece, Emphasis):
        return f"_{piece.text}_"
    if isinstance(piece, Code):
        return f"`{piece.text}`"
    if isinstance(piece, Arrow):
        return "->"
    return piece


def _html_block(block: Block, figures: Mapping[str, Figure]) -> str:
    if isinstance(block, Heading):
        return f"<h{block.level}>{html.escape(block.text)}</h{block.level}>"
    if isinstance(block, Paragraph):
        return ('<p class="speedup">' if block.lead else "<p>") + _html_text(block.text) + "</p>"
    if isinstance(block, Bullets):
        return "\n".join(["<ul>", *(f"<li>{_html_text(item)}</li>" for item in block.items), "</ul>"])
    if isinstance(block, Table):
        head = "".join(f"<th>{html.escape(cell)}</th>" for cell in block.header)
        body = "".join(
            f"<tr><th>{html.escape(row[0])}</th>"
            + "".join(f"<td>{html.escape(cell)}</td>" for cell in row[1:])
            + "</tr>"
            for row in block.rows
        )
        return f'<table id="{html.escape(block.id)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
    if isinstance(block, Chart):
        if block.name not in figures:
            raise ValueError(
                f"to_html: the chart {block.name!r} has no figure; figures given: {', '.join(figures) or 'none'}. "
                "Pass every charted figure in figures=."
            )
        return (
            f'<figure><img alt="{html.escape(block.name)} chart" '
            f'src="data:image/png;base64,{png_base64(figures[block.name])}"></figure>'
        )
    return f"<footer>{html.escape(block.text)}</footer>"


def _html_text(text: Text) -> str:
    return "".join(_html_inline(piece) for piece in ((text,) if isinstance(text, str) else text))


def _html_inline(piece: Inline) -> str:
    if isinstance(piece, Strong):
        return f"<b>{html.escape(piece.text)}</b>"
    if isinstance(piece, Emphasis):
        return f"<i>{html.escape(piece.text)}</i>"
    if isinstance(piece, Code):
        return f"<code>{html.escape(piece.text)}</code>"
    if isinstance(piece, Arrow):
        return "&rarr;"
    return html.escape(piece)
