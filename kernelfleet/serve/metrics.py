"""The server's Prometheus metrics, in a registry of its own (nothing global).

* ``kernelfleet_serve_time_to_first_token_seconds``: arrival to first token (queueing and prefill);
* ``kernelfleet_serve_time_per_output_token_seconds``: between a request's consecutive tokens;
* ``kernelfleet_serve_generated_tokens_total`` (tokens/s is its ``rate()``) and
  ``kernelfleet_serve_prompt_tokens_total``;
* ``kernelfleet_serve_requests_waiting`` (the queue depth), ``kernelfleet_serve_requests_running``
  (in a slot) and ``kernelfleet_serve_queue_limit_requests``;
* ``kernelfleet_serve_requests_total{finish_reason}`` (stop, length, cancelled, error) and
  ``kernelfleet_serve_rejected_requests_total`` (429s);
* ``kernelfleet_serve_device_busy_seconds_total{device}``: seconds each device ran forwards.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

FINISH_REASONS = ("stop", "length", "cancelled", "error")  # why a request ends (the engine names them)
# From 1 ms (a tiny model's step on a GPU) to a minute (a long queue), about ×2 apart
BUCKETS_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServeMetrics:
    """What the engine and the API report; :meth:`exposition` is ``/metrics``."""

    def __init__(self, max_queue: int) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=False)
        prefix = "kernelfleet_serve_"
        self.first_token = Histogram(prefix + "time_to_first_token_seconds", "Arrival to first token.",
                                     buckets=BUCKETS_SECONDS, registry=registry)
        self.per_token = Histogram(prefix + "time_per_output_token_seconds",
                                   "Time between a request's consecutive output tokens.",
                                   buckets=BUCKETS_SECONDS, registry=registry)
        self.generated = Counter(prefix + "generated_tokens", "Output tokens generated.", registry=registry)
        self.prompt = Counter(prefix + "prompt_tokens", "Prompt tokens prefilled.", registry=registry)
        self.waiting = Gauge(prefix + "requests_waiting", "Requests queued for a slot (the queue depth).",
                             registry=registry)
        self.running = Gauge(prefix + "requests_running", "Requests in a KV-cache slot.", registry=registry)
        Gauge(prefix + "queue_limit_requests", "Requests the queue holds (--max-queue).",
              registry=registry).set(max_queue)
        self.finished = Counter(prefix + "requests", "Requests finished, by why.", ["finish_reason"],
                                registry=registry)
        for reason in FINISH_REASONS:  # exported at 0 from the start, so a rate() sees the first ones finish
            self.finished.labels(reason)
        self.rejected = Counter(prefix + "rejected_requests", "Requests refused with 429: the queue was full.",
                                registry=registry)
        self.busy = Counter(prefix + "device_busy_seconds", "Seconds a device spent running forwards.",
                            ["device"], registry=registry)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
