"""Which format ``tether diagram`` writes: the one asked for, else the one ``-o FILE``'s name says.

A file named ``graph.png`` must hold a PNG: a format that contradicts the name, or a name whose
extension says no format tether writes, is refused before anything is drawn.
"""

from __future__ import annotations

from pathlib import Path

from tether.errors import ConfigError

FILE_FORMATS = {".mmd": "mermaid", ".mermaid": "mermaid", ".dot": "dot", ".gv": "dot", ".svg": "svg", ".png": "png"}
"""The format each extension of ``-o FILE`` names."""
DEFAULT_FORMAT = "mermaid"
"""Written to stdout, or to a file whose name has no extension."""


def output_format(output: str | None, asked: str | None, *, kind: str = "graph") -> str:
    """The format to write: ``asked`` (``--format``), else the one ``output``'s extension names, else Mermaid.

    Raises:
        ConfigError: ``asked`` and the extension name different formats; the extension names none
            (and none was asked); or a sequence diagram (Mermaid only) is asked in another format.
    """
    suffix = Path(output).suffix.lower() if output else ""
    named = FILE_FORMATS.get(suffix)
    known = ", ".join(FILE_FORMATS)
    if suffix and named is None and asked is None:
        raise ConfigError(f"-o {output}: cannot tell the format from {suffix!r} ({known}): give --format")
    if asked is not None and named is not None and asked != named:
        raise ConfigError(f"-o {output} names a {named} file but --format is {asked}: make them agree")
    chosen = asked or named or DEFAULT_FORMAT
    if kind == "sequence" and chosen != DEFAULT_FORMAT:
        given = f"--format {asked}" if asked else f"-o {output}"
        raise ConfigError(f"--kind sequence is drawn in Mermaid only, not {given}: write it to a .mmd file or stdout")
    return chosen


__all__ = ["FILE_FORMATS", "output_format"]
