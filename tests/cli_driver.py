"""``python -m tether ARGS`` in a process forked from the drivers' server (support.start_tether_forked)."""

import sys

from support import TETHER_MAIN
from tether.surfaces.cli import main

sys.argv[0] = TETHER_MAIN  # as under ``python -m tether``: the hints tether prints depend on it
sys.exit(main())
