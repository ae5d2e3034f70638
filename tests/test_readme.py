"""The README is the front door (issue 27): short enough to read, and every relative link in it
leads somewhere. What does not fit belongs in docs/ or bench/README.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_LINES = 400
# Written on the typed-settings branch (issue 27, item 5) at the same time as this README; drop the
# exemption when that branch lands.
# [text](target) and <a href="target">.
LINK = re.compile(r"\]\(([^)\s]+)\)|href=\"([^\"]+)\"")


def relative_links(text: str) -> list[str]:
    links = [a or b for a, b in LINK.findall(text)]
    return [link for link in links if not re.match(r"[a-z][a-z0-9+.-]*:|#", link)]


def test_the_readme_stays_a_front_door() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, (
        f"README.md has {len(lines)} lines; move the detail into docs/ (at most {MAX_LINES})"
    )


def test_every_relative_link_in_the_readme_points_to_a_file_that_exists() -> None:
    links = relative_links(README.read_text(encoding="utf-8"))
    assert "docs/protocol.md" in links and "bench/README.md" in links  # the checker sees the links
    missing = sorted({link for link in links if not (ROOT / link.split("#", 1)[0]).exists()})
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_the_link_checker_sees_a_broken_link() -> None:
    assert relative_links("see [x](docs/nope.md#a), [y](https://example.com), [z](#top)") == ["docs/nope.md#a"]
