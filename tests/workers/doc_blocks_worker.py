"""The documentation's mpiexec blocks of one world size in one launch (tests/test_docs.py): a
launch per block would start Python, torch and MPI once per block.

DOC_BLOCKS names a JSON file: [[case name, directory], ...]; each directory holds one block as
block.py. Each block is a harness case (harness.py: its own record, a failure aborts the job)
that runs the file as ``__main__`` in its directory, as ``python block.py`` would there.
"""

import json
import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def run_block(directory):
    def case():
        here = os.getcwd()
        os.chdir(directory)
        try:
            runpy.run_path(os.path.join(directory, "block.py"), run_name="__main__")
        finally:
            os.chdir(here)

    return case


if __name__ == "__main__":
    with open(os.environ["DOC_BLOCKS"], encoding="utf-8") as f:
        plan = json.load(f)
    harness.run_scripts([(os.path.basename(__file__), [(n, run_block(d)) for n, d in plan])])
