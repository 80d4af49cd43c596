"""Serving a model: the generation loop (prefill, decode with a KV cache per request slot,
continuous batching at step granularity), its device backends and the OpenAI-compatible HTTP API.

``scheduler`` and ``documents`` are plain Python; ``cache``, ``sampling``, ``backend`` and
``model`` touch torch; ``engine`` runs the loop on a backend; ``api``, ``stream`` and ``metrics``
serve it over HTTP; ``command`` is what ``kernelfleet serve`` starts (docs/serve.md).
"""
