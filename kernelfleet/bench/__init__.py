"""Benchmarks that run on a GPU and ship with the package (``kernelfleet bench ...``): timing and
reports only; the gate, the plans and the serving loop they run are the runtime's."""
