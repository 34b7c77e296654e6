"""tether's version: the one place it is written (the package's metadata and ``tether --version`` read it)."""

__version__ = "0.1.0"
