"""Every relative link in README.md, CHANGELOG.md and docs/*.md points to a file of the
tree, and every #anchor to a heading of the page it names."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def links(text: str) -> list[str]:
    text = FENCE.sub("", text)
    text = re.sub(r"`[^`\n]*`", lambda m: m.group(0) if "](" not in m.group(0) else "", text)
    return LINK.findall(text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*)$", text, re.M)}


def problems(page: Path) -> list[str]:
    out = []
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            out.append(f"{target}: no such file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    assert problems(page) == []


def test_the_checker_finds_broken_links(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "A.md").write_text("# A page\n\n## Two words\n", encoding="utf-8")
    page = tmp_path / "README.md"
    page.write_text("[ok](docs/A.md) [ok](docs/A.md#two-words) [ok](#top) [web](https://x.org/y)\n"
                    "[gone](docs/B.md) [bad anchor](docs/A.md#three)\n"
                    "```\n[in code](nowhere.md)\n```\n# Top\n", encoding="utf-8")
    assert problems(page) == ["docs/B.md: no such file docs/B.md",
                              "docs/A.md#three: no heading #three in docs/A.md"]
    assert slug("`aotriton-rocm tune`: on a GPU") == "aotriton-rocm-tune-on-a-gpu"
