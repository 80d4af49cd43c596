# The see half's node agent: `kernelfleet agent` (no torch, triton or solver), for
# deploy/kubernetes. Build from the repository root:
#
#   docker build -t REGISTRY/kernelfleet:0.1.0 .
#
# NVML's library and /dev/nvidia* are not in the image: the NVIDIA container
# runtime puts them in (RuntimeClass "nvidia", NVIDIA_VISIBLE_DEVICES=all).
# Pin the base images by digest for a release build.

FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY kernelfleet ./kernelfleet
# Wheels of kernelfleet and every dependency, so the final stage needs no compiler or network.
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.12-slim
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels kernelfleet \
    && rm -rf /wheels \
    && mkdir -p /var/lib/kernelfleet \
    && chown 65532:65532 /var/lib/kernelfleet
# Python writes no bytecode on a read-only root filesystem; uid 65532 has no passwd home.
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
# Non-root by default. The DaemonSet runs it as uid 0 with every capability dropped, because
# the kubelet's pod-resources socket is writable by root only (docs/kubernetes.md).
USER 65532:65532
VOLUME ["/var/lib/kernelfleet"]
EXPOSE 9400
# /healthz with the bearer token from KERNELFLEET_TOKEN, on KERNELFLEET_LISTEN (default 127.0.0.1:9400).
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-m", "kernelfleet.fleet.probe"]
ENTRYPOINT ["kernelfleet"]
# A non-loopback listen needs a token: run with -e KERNELFLEET_TOKEN=... (the agent refuses without).
CMD ["agent", "--listen", "0.0.0.0:9400", "--allow-remote", "--store", "/var/lib/kernelfleet/kernelfleet.db"]
