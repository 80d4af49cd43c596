"""Placement policies: the throughput MILP (HiGHS), the latency policy and baselines.

Plans are plain data (``Plan.to_json``) that the runtime consumes after ``validate.check``.
Start from ``model.Problem``; ``milp.solve_throughput`` and ``baselines.baselines`` read it.
"""
