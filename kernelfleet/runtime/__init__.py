"""The runtime: runs validated plans across devices (DESIGN.md, the *place* half, steps 6 and 7).

``plans`` (plans through the validator), ``serving`` (the real-time loop) and ``monitor`` are
pure; ``replicas``, ``gate``, ``executor``, ``link``, ``distributed``, ``ranks`` and ``command``
(``kernelfleet run``) touch the GPU.
"""
