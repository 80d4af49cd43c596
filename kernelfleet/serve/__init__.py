"""Serving a model: the generation loop (prefill, decode with a KV cache per request slot,
continuous batching at step granularity), its device backends and the OpenAI-compatible HTTP API.

``scheduler``, ``rows``, ``memory`` and ``documents`` are plain Python; ``cache``, ``sampling``,
``backend``, ``graphs`` (decode as a CUDA graph per batch bucket), ``device`` (the GPU and its
memory cap) and ``model`` touch torch; ``engine`` runs the loop on the backends of a ``strategies``
one (one device, request distribution, prefill/decode split); ``api``, ``stream``
and ``metrics`` serve it over HTTP; ``command`` is what ``kernelfleet serve`` starts (docs/serve.md).
"""
