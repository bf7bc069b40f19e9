"""Assemble README.md from docs/README.head.md and docs/sections/*.md, in file-name order.

python docs/build_readme.py          # rewrite README.md
python docs/build_readme.py --check  # exit 1 if README.md is out of date (the tests run this)
"""

import glob
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build() -> str:
    parts = [open(os.path.join(ROOT, "docs", "README.head.md")).read().rstrip()]
    for path in sorted(glob.glob(os.path.join(ROOT, "docs", "sections", "*.md"))):
        parts.append(open(path).read().rstrip())
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":
    text = build()
    readme = os.path.join(ROOT, "README.md")
    if "--check" in sys.argv:
        current = open(readme).read() if os.path.exists(readme) else ""
        sys.exit(0 if current == text else 1)
    with open(readme, "w") as f:
        f.write(text)
