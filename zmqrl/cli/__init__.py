"""Command line: the typer app (app.py) and one module per command group."""

from __future__ import annotations

# ``zmqrl.cli`` was one module before it was a package (an old install's console script calls
# ``zmqrl.cli:main``): its names still resolve, with a warning.
_OLD_NAMES = {name: "zmqrl.cli.app" for name in ("app", "main")}


def __getattr__(name: str) -> object:
    from zmqrl.moved import forward

    return forward(__name__, name, _OLD_NAMES)
