"""The ``inactive-heads`` command line, stopping for good after it writes one named file.

Run as ``python paused_sweep.py NAME ARGS...`` (tests/integration/test_sweep_resume.py): the
command runs with ARGS, and once it has written a file called NAME (a results file lands with a
rename, ``core.io.atomic_path``) it sleeps until it is killed, so a test can SIGKILL a sweep at an
exact point of its progress. NAME ``-`` never stops.
"""

import os
import sys
import time

STOP_AFTER = sys.argv[1] if __name__ == "__main__" else None
_replace = os.replace


def replace_then_stop(src, dst, *args, **kwargs):
    _replace(src, dst, *args, **kwargs)
    if os.path.basename(os.fspath(dst)) == STOP_AFTER:
        print(f"stopped after {STOP_AFTER}", file=sys.stderr, flush=True)
        while True:
            time.sleep(60)


if __name__ == "__main__":
    os.replace = replace_then_stop
    from inactive_heads.cli import main

    sys.exit(main(sys.argv[2:]))
