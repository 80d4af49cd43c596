"""The data-dependency graph of a kernel program."""
