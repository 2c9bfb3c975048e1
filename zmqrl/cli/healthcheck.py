"""``zmqrl health`` without the rest of the command line: what a container's health probe runs.

Docker and Kubernetes run the probe every few seconds in a container that is busy training; the
whole CLI (typer building every command, its help and its options) came close to the probe's
timeout there under load. ``zmqrl.cli.app.main`` hands ``zmqrl health [--file PATH]``
to :func:`main` here before typer builds its commands, and ``python3 -m zmqrl.cli.healthcheck``
(docker/compose.yaml's probe) skips the CLI's imports too: this module imports nothing but the
health file's reader (zmqrl/runtime/health.py), no torch, no typer. ``zmqrl health --help`` and any
argument it does not know go the long way, to the typer command (zmqrl/cli/roles.py), which
judges the same file with the same :func:`verdict`.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The command's exit codes (zmqrl/cli/options.py has the table): healthy, unhealthy.
HEALTHY, UNHEALTHY = 0, 1


def verdict(path: Path | None) -> tuple[int, str, bool]:
    """(exit code, the line to print, whether it is an error for stderr) for the health file at
    ``path`` ($ZMQRL_HEALTH_FILE if None)."""
    from zmqrl.runtime.health import HEALTH_FILE_ENV, health_path, judge, read_health

    path = path or health_path()
    if path is None:
        why = f"no health file: set {HEALTH_FILE_ENV} for the role (and here), or pass --file"
        return UNHEALTHY, f"error: {why}", True
    try:
        record = read_health(path)
    except ValueError as exc:
        return UNHEALTHY, f"unhealthy: {exc}", False
    ok, reason = judge(record)
    return (HEALTHY, reason, False) if ok else (UNHEALTHY, f"unhealthy: {reason}", False)


def parse(args: list[str]) -> tuple[bool, Path | None]:
    """(understood, --file) of ``zmqrl health``'s arguments; not understood: let typer answer."""
    match args:
        case []:
            return True, None
        case ["--file" | "-f", value] if not value.startswith("-"):
            return True, Path(value)
        case [arg] if arg.startswith("--file=") and len(arg) > len("--file="):
            return True, Path(arg.removeprefix("--file="))
    return False, None


def main(args: list[str]) -> int | None:
    """Run the check for ``zmqrl health ARGS``; None when typer must handle them (--help, typos)."""
    understood, path = parse(args)
    if not understood:
        return None
    code, line, error = verdict(path)
    print(line, file=sys.stderr if error else sys.stdout)
    return code


if __name__ == "__main__":
    # `python3 -m zmqrl.cli.healthcheck [--file PATH]`: docker/compose.yaml's probe, which skips
    # even the import of the CLI's other modules that the `zmqrl` console script makes.
    code = main(sys.argv[1:])
    if code is None:
        print("usage: python3 -m zmqrl.cli.healthcheck [--file PATH]  (zmqrl health --help)", file=sys.stderr)
        code = 2
    sys.exit(code)
