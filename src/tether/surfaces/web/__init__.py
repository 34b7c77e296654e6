"""``tether ui``: a web inspector of runs and an inbox of the calls waiting for a person.

Needs the ``ui`` extra (``pip install 'tether[ui]'``: Starlette, uvicorn, Jinja2, markdown-it-py). Its pages
and decisions are in :mod:`~tether.surfaces.web.app`, who may see what in
:mod:`~tether.surfaces.web.guard`, what each page reads in :mod:`~tether.surfaces.web.pages`,
the live streams in :mod:`~tether.surfaces.web.live`, and decisions (through
:meth:`tether.Runner.decide`, then a resume) in :mod:`~tether.surfaces.web.decisions`.
Templates and static files ship inside this package: nothing is loaded from another site.
"""

from tether.extras import require

require("ui", "the web inspector (tether.surfaces.web)")  # one line naming the extra, before any module of it fails
