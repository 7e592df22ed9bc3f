"""Mirror this checkout's source files into another folder, for a second ROS distro's venv.

    python3 tools/sync_tree.py DEST

Copies what `git ls-files --cached --others --exclude-standard` lists (what a clone of the
working tree would hold) when size or modification time differ, keeping the time, and removes
files it copied on an earlier run that are gone from the checkout. Build output and generated
files in DEST are left alone, so an editable install there stays valid and its interface build
is reused.

Why a copy: an editable install writes the generated ROS types into the source tree
(memory_node/srv, tf2_msgs, unitree_go, memory_node/*.so), built against one distro's
libraries. The Kilted .venv owns the checkout's copy of them; the Jazzy .venv-jazzy gets its
own tree.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ".synced-files"


def source_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    return sorted(name for name in listed.split("\0") if name and (ROOT / name).is_file())


def sync(dest: Path) -> tuple[int, int]:
    """Returns (files copied, files removed)."""
    dest.mkdir(parents=True, exist_ok=True)
    manifest = dest / MANIFEST
    previous = set(manifest.read_text().splitlines()) if manifest.exists() else set()
    names = source_files()
    copied = 0
    for name in names:
        source, target = ROOT / name, dest / name
        st = source.stat()
        if target.exists():
            tt = target.stat()
            if tt.st_size == st.st_size and tt.st_mtime_ns == st.st_mtime_ns:
                continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        copied += 1
    removed = 0
    for name in sorted(previous - set(names)):
        stale = dest / name
        if stale.is_file():
            stale.unlink()
            removed += 1
    manifest.write_text("".join(f"{name}\n" for name in names))
    return copied, removed


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    dest = Path(argv[0]).resolve()
    if dest == ROOT or ROOT in dest.parents and not dest.is_relative_to(ROOT / "build"):
        print(f"sync_tree: {dest} must be outside the checkout or under build/", file=sys.stderr)
        return 2
    copied, removed = sync(dest)
    print(f"sync_tree: {dest}: {copied} copied, {removed} removed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
