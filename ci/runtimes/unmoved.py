"""Fail when a package present before an install changed version or vanished.

    python unmoved.py BEFORE_FREEZE AFTER_FREEZE ALLOWED_UPGRADES

ALLOWED_UPGRADES lists, one per line, the names that may move (``name  # reason``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def versions(freeze: str) -> dict[str, str]:
    found = {}
    for line in Path(freeze).read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            found[re.sub(r"[-_.]+", "-", name).lower()] = version.strip()
    return found


def allowed(path: str) -> set[str]:
    if not Path(path).exists():
        return set()
    names = (line.split("#", 1)[0].strip() for line in Path(path).read_text().splitlines())
    return {re.sub(r"[-_.]+", "-", name).lower() for name in names if name}


def main(before_path: str, after_path: str, allow_path: str) -> int:
    before, after, allow = versions(before_path), versions(after_path), allowed(allow_path)
    moved = {name: (old, after.get(name)) for name, old in before.items()
             if after.get(name) != old}
    added = sorted(set(after) - set(before))
    if added:
        print(f"added (new to the environment): {', '.join(added)}")
    for name, (old, new) in sorted(moved.items()):
        note = "allowed" if name in allow else "NOT ALLOWED"
        print(f"moved: {name} {old} -> {new or 'removed'} ({note})")
    refused = sorted(set(moved) - allow)
    if refused:
        print(f"the install replaced the runtime's {', '.join(refused)}: give raybricks a "
              "range that admits the runtime's version", file=sys.stderr)
        return 1
    print(f"unmoved: {len(before) - len(moved)} of {len(before)} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
