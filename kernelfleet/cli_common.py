"""What every ``kernelfleet`` command shares: the error console and common options."""

import typer
from rich.console import Console

err = Console(stderr=True, soft_wrap=True)
CatalogOption = typer.Option(None, "--catalog", help="A catalog override file (TOML).")
