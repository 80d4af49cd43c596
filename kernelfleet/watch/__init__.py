"""`kernelfleet watch`: the live terminal view, a client of telemetry/ and ofu/.

``rows`` turns a window into plain data (``--json``), ``screen`` lays it out for a terminal width,
``state`` holds history, sort and selection, ``keys`` and ``live`` drive the terminal.
"""

from kernelfleet.watch.rows import rows

__all__ = ["rows"]
