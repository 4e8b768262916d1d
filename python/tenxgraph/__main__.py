"""``python -m tenxgraph``: the ``tenxgraph`` command (see tenxgraph.cli)."""

import sys

from tenxgraph.cli import main

sys.exit(main())
