"""MkDocs hook: the pictures in diagrams/ (kept there, beside the scripts that regenerate them) join the site.

``scripts/diagrams`` and ``scripts/ui-screenshots`` write into the repository's ``diagrams/``;
the pages link to ``diagrams/NAME`` as if it were inside ``docs/``, and this hook adds those
files to the build, so there is one copy of each picture and ``strict`` still checks the links.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
PICTURES = ("*.svg", "*.png")


def on_files(files: Files, config: MkDocsConfig, **_: Any) -> Files:
    """Add every picture of ``diagrams/`` to the site, at ``diagrams/NAME``."""
    for pattern in PICTURES:
        for picture in sorted((ROOT / "diagrams").glob(pattern)):
            files.append(
                File(
                    f"diagrams/{picture.name}",
                    src_dir=str(ROOT),
                    dest_dir=config.site_dir,
                    use_directory_urls=config.use_directory_urls,
                )
            )
    return files
