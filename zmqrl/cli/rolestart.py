"""How the supervisor starts a role: ``python -m zmqrl.cli.rolestart ROLE CONFIG [FLAGS]``.

The same role commands as ``zmqrl learner | actor | evaluator`` (zmqrl/cli/roles.py), called
without building typer's command tree: typer builds a pydantic TypeAdapter for every parameter of
the command it runs, and importing pydantic with the rest of the app slows each role's start
(docs/performance.md, "startup"). The learner's start is on the launch's critical path, and every
actor's competes with it for the same cores.

The arguments are the supervisor's own (``zmqrl.supervisor.processes.role_command`` writes them),
never a user's: only those shapes are understood, anything else is a usage error (exit 2). People
and orchestrators start roles with ``zmqrl learner ...``, whose ``--help`` explains them.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Usage errors exit like typer's (zmqrl/cli/options.py: EXIT_CONFIG), without importing it first.
EXIT_USAGE = 2
# A second SIGINT interrupts the role at once (zmqrl/cli/process.py): 128 + SIGINT, as typer exits.
EXIT_INTERRUPTED = 130

# Each role's flags, as role_command writes them (``--id N`` is the actor's only valued flag).
ROLE_FLAGS = {"learner": {"--resume"}, "actor": {"--replacement"}, "evaluator": {"--resume"}}


def parse(args: list[str]) -> tuple[str, Path, set[str], str | None] | None:
    """(role, config, flags, actor id) of ``args``; None when they are not what role_command writes."""
    if len(args) < 2 or args[0] not in ROLE_FLAGS or args[1].startswith("-"):
        return None
    role, config, rest = args[0], Path(args[1]), args[2:]
    actor_id = None
    if role == "actor" and rest[:1] == ["--id"]:
        if len(rest) < 2 or not rest[1].isdigit():
            return None
        actor_id, rest = rest[1], rest[2:]
    flags = set(rest)
    if len(flags) != len(rest) or not flags <= ROLE_FLAGS[role]:
        return None
    return role, config, flags, actor_id


def main(args: list[str]) -> int:
    """Run the role ``args`` name; its exit code (the role command's, as under typer)."""
    parsed = parse(args)
    if parsed is None:
        print(
            f"usage: python -m zmqrl.cli.rolestart ROLE CONFIG [FLAGS], as the supervisor writes it; "
            f"got {args!r} (by hand: zmqrl learner|actor|evaluator --help)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    role, config, flags, actor_id = parsed
    import typer

    from zmqrl.cli import roles

    try:
        if role == "learner":
            roles.learner(config, resume="--resume" in flags)
        elif role == "actor":
            roles.actor(config, id=actor_id, replacement="--replacement" in flags)
        else:
            roles.evaluator(config, resume="--resume" in flags)
    except typer.Exit as done:  # every role command ends with one
        return int(done.exit_code)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
