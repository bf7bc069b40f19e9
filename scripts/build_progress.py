"""Run a build command and show its progress in one short line per compiled file.

    python scripts/build_progress.py -- python -m pip install -v --no-build-isolation -e .

torch's extension builder runs ninja verbosely: each step prints a compiler command of a
few thousand characters. This prints ``[3/25] csrc/ops/consensus.cpp`` for each instead, and
compiler warnings and errors as they are. When the command fails, the last 150 lines of its
full output follow. Exits with the command's status.
"""

import collections
import re
import subprocess
import sys
import time

STEP = re.compile(r"^\s*\[(\d+)/(\d+)\] (.*)$")  # pip -v indents its subprocess's lines
SOURCE = re.compile(r" -c (\S+\.(?:cpp|cc|cu))(?=\s|$)")
# Compiler diagnostics (file:line:col: ...), errors, and the build's own notice.
NOTABLE = re.compile(
    r":\d+(:\d+)?: (fatal error|error|warning):|^\s*(error|Error|ERROR|Traceback|fluxmpi_py:)"
)


def describe(command: str) -> str:
    """The source file a ninja step compiles, from csrc/ on."""
    m = SOURCE.search(command)
    if m is None:
        return command[:100]
    path = m.group(1)
    return "compiling " + path[path.find("csrc/") :] if "csrc/" in path else "compiling " + path


def main(argv):
    if "--" in argv:
        argv = argv[argv.index("--") + 1 :]
    if not argv:
        sys.exit(__doc__)
    start = time.monotonic()
    tail = collections.deque(maxlen=150)
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        bufsize=1,
    )
    for line in proc.stdout:
        line = line.rstrip("\n")
        tail.append(line)
        m = STEP.match(line)
        if m:
            print(
                f"  [{m.group(1)}/{m.group(2)}] {describe(m.group(3))}"
                f"  ({time.monotonic() - start:.0f} s)",
                flush=True,
            )
        elif NOTABLE.search(line):
            print("  " + line.strip(), flush=True)
    rc = proc.wait()
    if rc != 0:
        print(f"build failed (exit {rc}); the last {len(tail)} lines of its output:", flush=True)
        print("\n".join(tail), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
