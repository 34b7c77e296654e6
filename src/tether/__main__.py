"""``python -m tether``."""

import sys

from tether.surfaces.cli import main

sys.exit(main())
