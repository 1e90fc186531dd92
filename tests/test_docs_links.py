"""README and docs/*.md as a reader follows them: every relative link and image resolves to a file of the
checkout (and a `#section` to a heading of it), and README's "Where the rest lives" links every docs page."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from convsweep.base.paths import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")


def links(page: Path) -> list[str]:
    """The link targets of a Markdown page, outside code blocks and inline code."""
    text = CODE.sub("", FENCE.sub("", page.read_text(encoding="utf-8")))
    return LINK.findall(text)


def anchors(page: Path) -> set[str]:
    """GitHub's ids of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#{1,6} (.+)$", text, re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not a file of the checkout
            continue
        path, _, section = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.is_relative_to(ROOT) or not file.exists():
            broken.append(f"{target}: no such file")
        elif section and file.suffix == ".md" and section not in anchors(file):
            broken.append(f"{target}: no heading #{section} in {file.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_pages_have_links_to_check():
    assert "docs/img/op-time.png" in links(ROOT / "README.md")
    assert "img/history.png" in links(ROOT / "docs" / "compare.md")


def test_readme_links_every_docs_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rest = readme.split("## Where the rest lives", 1)[1]
    linked = set(LINK.findall(rest))
    missing = sorted(f"docs/{page.name}" for page in PAGES[1:] if f"docs/{page.name}" not in linked)
    assert not missing, f"README's \"Where the rest lives\" does not link {missing}"


def test_the_broken_link_check_finds_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[a](missing.md) `[b](in-code.md)`\n```\n[c](in-fence.md)\n```\n![d](img/x.png)\n")
    assert links(page) == ["missing.md", "img/x.png"]
    assert anchors(ROOT / "docs" / "sweeps.md") >= {"the-sweep-files", "tunables-jobs-and-searches"}
