"""The module maps in the docs name every module the package has, so a newcomer finds each.

docs/design.md's "Layers" names every source file; the README's Layout names every
subpackage."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "memory_node"
GENERATED = {"srv", "msg", "__pycache__"}  # rosidl output (make setup), not source


def _block_after(text: str, heading: str) -> str:
    """The first fenced block after `heading`."""
    rest = text[text.index(heading):]
    return re.search(r"```\n(.*?)```", rest, re.S).group(1)


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*") if p.suffix in (".py", ".sql")
                  and p.name != "__init__.py"
                  and not GENERATED & set(p.relative_to(PACKAGE).parts))


def test_design_layers_name_every_module():
    layers = _block_after((ROOT / "docs" / "design.md").read_text(), "## Layers")
    sources = _sources()
    assert len(sources) > 60  # the walk found the package
    missing = [str(p.relative_to(PACKAGE)) for p in sources
               if not re.search(rf"(?<![\w/]){re.escape(p.name)}\b", layers)]
    assert missing == [], f"docs/design.md's Layers does not name {missing}"
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name not in GENERATED}
    assert {n for n in packages if f"{n}/" not in layers} == set()


def test_readme_layout_names_every_subpackage():
    layout = _block_after((ROOT / "README.md").read_text(), "## Layout")
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name not in GENERATED}
    assert {n for n in packages if f"memory_node/{n}/" not in layout} == set()
    tests = {p.name for p in (ROOT / "test").iterdir() if p.is_dir()
             and p.name not in ("wheels", "__pycache__")}
    line = next(ln for ln in layout.splitlines() if ln.startswith("test/"))
    assert {n for n in tests if f"{n}/" not in line} == set()
