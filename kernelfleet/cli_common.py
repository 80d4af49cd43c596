"""What every ``kernelfleet`` command shares: the error console and common options."""

import typer
from rich.console import Console

err = Console(stderr=True, soft_wrap=True)
CatalogOption = typer.Option(None, "--catalog", help="A catalog override file (TOML).")


def out_console() -> Console:
    """The console for a command's tables: the terminal's width, or wide enough for a whole table
    when the output goes to a file or a pipe (rich would otherwise wrap it at 80 columns)."""
    import sys

    return Console() if sys.stdout.isatty() else Console(width=200)
