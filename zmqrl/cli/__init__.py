"""Command line: the typer app (app.py) and one module per command group (launch, roles, status,
plot), which share options.py (the config argument, --set, exit codes) and process.py (what a role
command does around its role).

``COMMAND_STARTED`` is taken here, the first thing any CLI import runs, so that the "N s after
launch" of a run's summary counts from the command's start, not from after typer and rich loaded.
"""

from __future__ import annotations

import time

COMMAND_STARTED = time.time()

# ``zmqrl.cli`` was one module before it was a package (an old install's console script calls
# ``zmqrl.cli:main``): its names still resolve, with a warning.
_OLD_NAMES = {name: "zmqrl.cli.app" for name in ("app", "main")}


def __getattr__(name: str) -> object:
    from zmqrl.moved import forward

    return forward(__name__, name, _OLD_NAMES)
