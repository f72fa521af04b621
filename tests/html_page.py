"""Reading a report page back in tests: its text, its tags and every reference out of it."""
from __future__ import annotations

from html.parser import HTMLParser


class Page(HTMLParser):
    """What a test reads of a page: its visible text, the tags it holds, and every reference out of
    it (src / href attributes and url(...) in style sheets)."""

    def __init__(self, text: str):
        super().__init__()
        self.tags: dict[str, int] = {}
        self.refs: list[tuple[str, str, str]] = []
        self.images: list[str] = []
        self.chunks: list[str] = []
        self._skip = 0
        self.feed(text)
        self.text = " ".join(" ".join(self.chunks).split())

    def handle_starttag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1
        for name, value in attrs:
            if name in ("src", "href", "xlink:href", "srcset") and value is not None:
                self.refs.append((tag, name, value))
        if tag == "img":
            self.images.append(dict(attrs).get("src") or "")
        if tag in ("style", "script"):
            self._skip += 1

    def handle_endtag(self, tag):
        if tag in ("style", "script"):
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.chunks.append(data)


def embedded_only(page: Page, raw: str):
    """Nothing on the page is fetched: images are data: URLs, links and SVG references point inside
    the page, there is no script or style sheet file, and no url(...) leaves the page."""
    assert all(src.startswith("data:image/") for src in page.images), page.images
    outside = [r for r in page.refs if not (r[2].startswith("#") or r[2].startswith("data:"))]
    assert not outside, outside
    assert "link" not in page.tags and "script" not in page.tags and "iframe" not in page.tags
    assert "url(http" not in raw and "@import" not in raw
