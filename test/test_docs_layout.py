"""The module maps in the docs name every module the package has, so a newcomer finds each.

docs/design.md's "Layers" names every source file; the README's Layout names every
subpackage; docs/architecture.md, which follows two requests through the modules, names only
what exists."""

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


def _section(text: str, heading: str) -> str:
    """From `heading` to the next heading of its level."""
    rest = text[text.index(heading) + len(heading):]
    end = rest.find("\n## ")
    return rest if end < 0 else rest[:end]


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


# docs/architecture.md's conventions: a module is its path under memory_node/ in backticks
# (`core/planner.py`); a class is `CamelCase`, a member `Class.member`, a function `name()`.
# Everything else in backticks (parameters, fields, topics) is not checked.
MODULE_REF = re.compile(r"`((?:[a-z_]+/)+[a-z_]+\.(?:py|sql))`")
CLASS_REF = re.compile(r"`([A-Z]\w*)(?:\.(\w+))?(?:\(\))?`")
FUNCTION_REF = re.compile(r"`([a-z_]\w*)\(\)`")


def _definitions() -> tuple[dict[str, list[str]], set[str]]:
    """class name -> the source of each file defining it; every function and method name."""
    classes: dict[str, list[str]] = {}
    functions: set[str] = set()
    for path in _sources():
        text = path.read_text()
        for name in re.findall(r"^\s*class (\w+)", text, re.M):
            classes.setdefault(name, []).append(text)
        functions.update(re.findall(r"^\s*(?:async )?def (\w+)", text, re.M))
    return classes, functions


def test_architecture_page_names_what_exists_and_design_names_the_rest():
    """docs/architecture.md follows a search request and a camera frame module by module; it
    stays in step with the code by one simple rule: every module it names (its path under
    memory_node/) exists, every class it names is defined in the package, every
    `Class.member` is defined (def, or an attribute set) in that class's file, and every
    `function()` is defined somewhere. Every module not on the page is in docs/design.md's
    Layers (the list of them all, checked above). README's Layout and design.md link the
    page."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    named = set(MODULE_REF.findall(page))
    assert len(named) > 30  # the convention is in use
    assert sorted(n for n in named if not (PACKAGE / n).is_file()) == []
    classes, functions = _definitions()
    wrong = []
    for cls, member in CLASS_REF.findall(page):
        files = classes.get(cls)
        if files is None:
            wrong.append(cls)
        elif member and not any(re.search(rf"def {member}\b|self\.{member}\s*[:=]"
                                          rf"|^\s+{member}\s*[:=]", f, re.M) for f in files):
            wrong.append(f"{cls}.{member}")
    wrong += [f"{f}()" for f in FUNCTION_REF.findall(page) if f not in functions]
    assert wrong == [], f"docs/architecture.md names what the package does not define: {wrong}"
    layers = _block_after((ROOT / "docs" / "design.md").read_text(), "## Layers")
    unlisted = [str(p.relative_to(PACKAGE)) for p in _sources()
                if str(p.relative_to(PACKAGE)) not in named
                and not re.search(rf"(?<![\w/]){re.escape(p.name)}\b", layers)]
    assert unlisted == [], f"neither docs/architecture.md nor design.md's Layers: {unlisted}"
    assert "(architecture.md)" in _section((ROOT / "docs" / "design.md").read_text(), "## Layers")
    assert "(docs/architecture.md)" in _section((ROOT / "README.md").read_text(), "## Layout")
