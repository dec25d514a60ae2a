"""docs/architecture.md stays true to the tree: it names every module and nothing that is gone, and its two arrow
diagrams (between the top-level folders, between serving's rooms) are the import graph's.

The graph is ``benchmarks/import_graph.py``'s (parsed, nothing imported): ``python benchmarks/import_graph.py`` and
``python benchmarks/import_graph.py --depth 2 --within serving`` print what the diagrams must show.
"""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.import_graph import graph

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("serving", "converters", "batch", "loadtest")
"""The installed packages: every module of these is named in the doc."""
_SECTION_FOLDER = re.compile(r"^## .*\(`(\w+)/`\)", re.MULTILINE)
_CODE = re.compile(r"`([^`\s]+)`")
WRITTEN = {"model.py"}
"""Files the doc names that mtgate writes rather than holds (export-triton's Triton entry point)."""
_ARROW = re.compile(r"^(\S+) -> (\S+)$")


def sections(text: str) -> list[tuple[str | None, str]]:
    """(folder the section is about, if its title names one as ``(`batch/`)``; its text) per ``## `` section."""
    parts = re.split(r"^(?=## )", text, flags=re.MULTILINE)
    return [(m.group(1) if (m := _SECTION_FOLDER.match(part)) else None, part) for part in parts]


def package_modules() -> list[str]:
    """Every module file of the installed packages, relative to the root (not ``__init__``/``__main__``)."""
    return sorted(p.relative_to(ROOT).as_posix() for package in PACKAGES for p in (ROOT / package).rglob("*.py")
                  if p.name not in ("__init__.py", "__main__.py"))


def named(text: str) -> dict[str, set[str]]:
    """The modules the doc names, each with the paths it may mean: code spans ending in ``.py`` (a path from the root,
    or from the folder of the section they are in), and, in a section about a folder, a table's first-column names
    (``| `workers` |``: that folder's ``workers.py``)."""
    found: dict[str, set[str]] = {}
    for folder, part in sections(text):
        for token in _CODE.findall(part):
            if token.endswith(".py"):
                found.setdefault(token, {token}).update({f"{folder}/{token}"} if folder else set())
        if folder:
            for row in re.findall(r"^\| (`[^|]+`) \|", part, flags=re.MULTILINE):
                for name in _CODE.findall(row):
                    if re.fullmatch(r"\w+", name):
                        found.setdefault(name, set()).add(f"{folder}/{name}.py")
    return found


def _means(token: str, paths: set[str], module: str) -> bool:
    return module in paths or (token.endswith(".py") and module.endswith("/" + token))


def test_the_doc_names_every_module() -> None:
    doc = named(DOC.read_text(encoding="utf-8"))
    missing = [m for m in package_modules() if not any(_means(t, paths, m) for t, paths in doc.items())]
    assert missing == [], f"docs/architecture.md does not name: {', '.join(missing)}"


def test_every_module_the_doc_names_exists() -> None:
    files = [p.relative_to(ROOT).as_posix() for folder in (*PACKAGES, "benchmarks", "tests", "models")
             for p in (ROOT / folder).rglob("*.py")]
    stale = sorted(t for t, paths in named(DOC.read_text(encoding="utf-8")).items()
                   if t not in WRITTEN and not any(_means(t, paths, f) for f in files))
    assert stale == [], f"docs/architecture.md names files that do not exist: {', '.join(stale)}"


def drawn_arrows(heading: str) -> set[tuple[str, str]]:
    """The ``a -> b`` lines of the first ``text`` block after the section ``heading``."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index(heading):]
    block = section[section.index("```text\n") + 8:]
    block = block[:block.index("```")]
    return {(m.group(1), m.group(2)) for line in block.splitlines() if (m := _ARROW.match(line.strip()))}


def test_the_doc_draws_the_arrows_between_the_top_level_folders() -> None:
    actual = set(graph(ROOT, PACKAGES + ("benchmarks",), 1))
    assert drawn_arrows("## Imports between the top-level folders") == actual


def test_the_doc_draws_the_arrows_between_servings_rooms() -> None:
    actual = {(a, b) for a, b in graph(ROOT, ("serving",), 2) if b != "serving"}  # serving's own: __version__
    assert drawn_arrows("## Arrows inside `serving/`") == actual
