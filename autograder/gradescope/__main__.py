"""``python -m autograder.gradescope LAB ZIP``: see ``autograder/gradescope/__init__.py``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autograder.__main__ import GraderError
from autograder.gradescope import build_archive


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m autograder.gradescope", description="Build a Gradescope autograder.")
    ap.add_argument("lab", help="the lab: lab06, 06, 6 or lab06_radix_cache")
    ap.add_argument("zip", type=Path, help="the archive to write (upload it as the assignment's autograder)")
    args = ap.parse_args(argv)
    try:
        names = build_archive(args.lab, args.zip)
    except GraderError as e:
        print(f"gradescope: {e}", file=sys.stderr)
        return 2
    tests = [n for n in names if n.startswith(("autograder/test_lab", "autograder/hidden/test_lab"))]
    print(f"wrote {args.zip} ({len(names)} files; tests: {', '.join(tests)})")
    print("upload it under the assignment's Configure Autograder (base image: Ubuntu 24.04); see autograder/README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
