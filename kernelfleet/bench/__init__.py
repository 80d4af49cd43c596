"""Benchmarks that run on a GPU and ship with the package (``kernelfleet bench ...``)."""
