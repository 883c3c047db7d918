"""``umctl``, the console script: the process's entry point, kept light on purpose.

It imports nothing but :mod:`umctl.interrupts` before handing over, so the SIGINT/SIGTERM
handlers are in place before the CLI's imports (typer, rich and the command modules take a few
hundred ms) and ``umctl version`` answers without them: see :func:`umctl.interrupts.run_cli`.
``python3 -m umctl.cli.entry`` and ``python3 -m umctl.cli.main`` run the same way.
"""

from umctl.interrupts import run_cli


def _load_main():
    from umctl.cli.main import main

    return main


def entry() -> None:
    """Run umctl on ``sys.argv`` and exit with its status (:func:`umctl.cli.main.main`)."""
    run_cli(_load_main)


if __name__ == "__main__":
    entry()
