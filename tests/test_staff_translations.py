"""Every staff string is translated in English and Simplified Chinese, in both of Django's
domains: ``django`` (templates) and ``djangojs`` (the staff pages' scripts, served by the
JavaScript catalog). A string added to a page and not run through makemessages, left without a
translation, left fuzzy, or not compiled into the committed .mo fails here (issue 31, item 5)."""

from __future__ import annotations

import ast
import gettext
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOCALE = ROOT / "locale"
LANGUAGES = ("en", "zh_Hans")
DOMAINS = ("django", "djangojs")
# The staff pages' scripts whose strings go through gettext() (the catalog's domain).
STAFF_SCRIPTS = (ROOT / "static" / "kefu" / "ops.js", ROOT / "static" / "kefu" / "console.js")


def entries(po: Path) -> list[tuple[str, str, bool]]:
    """``(msgid, msgstr, fuzzy)`` of every entry of a .po file but its header, multi-line strings
    joined as gettext joins them."""
    found = []
    for block in po.read_text(encoding="utf-8").split("\n\n"):
        lines = block.strip().splitlines()
        fuzzy = any(line.startswith("#,") and "fuzzy" in line for line in lines)
        fields: dict[str, str] = {}
        key = ""
        for line in lines:
            if line.startswith("#") or not line:
                continue
            m = re.match(r'^(msgid|msgstr|msgctxt|msgid_plural|msgstr\[\d+\]) (".*")$', line)
            if m:
                key = m.group(1)
                fields[key] = ast.literal_eval(m.group(2))
            else:
                fields[key] += ast.literal_eval(line)
        if fields.get("msgid"):
            found.append((fields["msgid"], fields.get("msgstr", fields.get("msgstr[0]", "")), fuzzy))
    return found


@pytest.mark.parametrize("domain", DOMAINS)
@pytest.mark.parametrize("lang", LANGUAGES)
def test_every_staff_string_is_translated_and_compiled(lang: str, domain: str) -> None:
    po = LOCALE / lang / "LC_MESSAGES" / f"{domain}.po"
    found = entries(po)
    assert found, po
    assert [m for m, s, _ in found if not s] == [], f"{lang}/{domain}: untranslated"
    assert [m for m, _, fuzzy in found if fuzzy] == [], f"{lang}/{domain}: fuzzy (check and clear the flag)"
    if lang == "en":
        assert [m for m, s, _ in found if s != m] == [], "English msgstr equals msgid"
    with (LOCALE / lang / "LC_MESSAGES" / f"{domain}.mo").open("rb") as mo:
        compiled = gettext.GNUTranslations(mo)
    stale = [m for m, s, _ in found if compiled.gettext(m) != s]
    assert stale == [], f"{lang}/{domain}: compile the messages (manage.py compilemessages)"


def test_every_string_the_staff_scripts_translate_is_in_the_catalog() -> None:
    wanted = set()
    for script in STAFF_SCRIPTS:
        for literal in re.findall(r'\bgettext\(("(?:[^"\\]|\\.)*")\)', script.read_text(encoding="utf-8")):
            wanted.add(ast.literal_eval(literal))
    assert len(wanted) > 20
    for lang in LANGUAGES:
        have = {m for m, _, _ in entries(LOCALE / lang / "LC_MESSAGES" / "djangojs.po")}
        assert sorted(wanted - have) == [], f"{lang}: run makemessages -d djangojs"
