"""``python -m inactive_heads.cli``: the ``inactive-heads`` command."""

import sys

from .entry import main

sys.exit(main())
