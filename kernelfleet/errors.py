"""The three kinds of error kernelfleet raises (STYLE.md, rule 6).

Every error a user can cause or fix carries a one-line message that says what
was expected, what came, and what to do; the CLI prints that line and exits
non-zero, never a traceback.
"""


class KernelfleetError(Exception):
    """Base class: ``str(error)`` is the one line shown to the user."""

    exit_code = 1


class UsageError(KernelfleetError):
    """Misuse: a bad argument, a bad file. Names what was expected and what came."""

    exit_code = 2


class EnvironmentProblem(KernelfleetError):
    """Broken environment: no driver, no permission. Says how to fix it."""

    exit_code = 3


class Unsupported(KernelfleetError):
    """The hardware lacks a feature (e.g. GPM before Hopper). Reported, not fatal."""

    exit_code = 4
