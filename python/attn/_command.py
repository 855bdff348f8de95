"""The `attn` command of the Python package: the C++ program tools/attn, which the wheel
carries as attn/bin/attn, run in this process's place (exec), so that its output, exit
status and signals are the program's own."""

import os
import sys


def main():
    program = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "attn")
    if not os.access(program, os.X_OK):
        sys.exit(f"attn: the command-line program {program} is missing from this installation "
                 f"of the attn package; reinstall it (pip install .)")
    os.execv(program, [sys.argv[0], *sys.argv[1:]])
