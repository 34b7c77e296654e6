"""Imported last by the drivers' forkserver (support.FORKSERVER_PRELOAD): freeze what it preloaded.

Each driver forked from the server would otherwise traverse those objects in its first full
collection (an AsyncRunner collects when it is made, see tether.heap) and so copy the pages
they live on: about 0.1 s of CPU per driver. Frozen, the collector never visits them.
"""

from tether.heap import freeze_startup_heap

freeze_startup_heap()
