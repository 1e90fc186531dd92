"""A document as a list of blocks (headings, paragraphs, bullets, tables, figures) and its two
renderings: GitHub Markdown with the figures linked, and one self-contained HTML page with them
embedded. The report builds the blocks; nothing here knows what they say.
"""
from __future__ import annotations

import base64
import html
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tabulate import tabulate


# -- the blocks --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Bullets:
    items: list[str]


@dataclass(frozen=True)
class Table:
    headers: list[str]
    rows: list[list[str]]
    numeric: list[bool]  # right-aligned columns


@dataclass(frozen=True)
class Figure:
    path: Path
    kind: str
    text: str


# -- rendering ---------------------------------------------------------------------------------------
def to_markdown(blocks: Sequence, base: Path) -> str:
    """The blocks as GitHub Markdown; figures are image links relative to `base` (report.md's folder)."""
    parts = []
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"{'#' * block.level} {block.text}")
        elif isinstance(block, Paragraph):
            parts.append(block.text)
        elif isinstance(block, Bullets):
            parts.append("\n".join(f"- {item}" for item in block.items))
        elif isinstance(block, Table):
            parts.append(tabulate(block.rows, headers=block.headers, tablefmt="github", disable_numparse=True,
                                  colalign=["right" if n else "left" for n in block.numeric]))
        elif isinstance(block, Figure):
            link = Path(os.path.relpath(block.path, base)).as_posix()
            parts.append(f"**{block.kind}**: {block.text}\n\n![{block.kind}]({link})")
    return "\n\n".join(parts) + "\n"


PAGE_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 80em; padding: 0 1em; color: #1e293b; }
h1 { font-size: 1.6em; } h2 { font-size: 1.3em; border-bottom: 1px solid #cbd5e1; margin-top: 2em; }
h3 { font-size: 1.05em; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #cbd5e1; padding: 0.2em 0.6em; white-space: nowrap; }
th { background: #f1f5f9; }
code { background: #f1f5f9; padding: 0 0.2em; }
figure { margin: 2em 0; } figure img { max-width: 100%; border: 1px solid #e2e8f0; margin-top: 0.5em; }
"""


def to_html(blocks: Sequence, title: str) -> str:
    """The blocks as one self-contained HTML page: figures are embedded, so the page reads the same
    inside the Snakemake report or mailed on its own."""
    parts = []
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"<h{block.level}>{_inline(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            parts.append(f"<p>{_inline(block.text)}</p>")
        elif isinstance(block, Bullets):
            parts.append("<ul>" + "".join(f"<li>{_inline(item)}</li>" for item in block.items) + "</ul>")
        elif isinstance(block, Table):
            parts.append(tabulate(block.rows, headers=block.headers, tablefmt="html", disable_numparse=True,
                                  colalign=["right" if n else "left" for n in block.numeric]))
        elif isinstance(block, Figure):
            data = base64.b64encode(block.path.read_bytes()).decode()
            parts.append(f"<figure><figcaption><strong>{html.escape(block.kind)}</strong>: {_inline(block.text)}"
                         f'</figcaption><img src="data:image/png;base64,{data}" alt="{html.escape(block.kind)}">'
                         "</figure>")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{PAGE_STYLE}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n")


def _inline(text: str) -> str:
    """The Markdown the blocks use inline (`code` and **bold**) as HTML, everything else escaped."""
    escaped = html.escape(text, quote=False)
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", escaped)
