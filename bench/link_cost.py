"""Benchmark: what a copy between two device profiles costs inside the executor's graph (on a GPU,
under a minute on one H200):

    python -m bench.link_cost --out DIR [--profile a:64 --profile b:32] [--trials 20]

Opens the profiles together (disjoint partitions, as ``kernelfleet profile`` and ``bench disagg``
run them), builds the graphs of ``profile/linkcost.py`` (memcpy nodes as the executor adds them,
between small captured kernels in each partition's context) and writes ``DIR/links.json``, a
``kernelfleet_links`` document: per pair, a copy between kernels and a copy queued behind others
(a fixed cost and a bandwidth each) and the wait a dependency across the devices adds. It prints,
per size, the measured time of a copy beside what today's model (``--copy-us`` 4 µs + bytes at
``--link-gbps`` 25 GB/s) charges. ``python -m bench.place_table --link DIR/links.json`` then
re-predicts the recorded placement run with it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench import Parser, command_line, gpu_folder
from kernelfleet.errors import UsageError

PROFILES = ("a:64", "b:32")  # the pair of tests/data/h200-place-pairs


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="Folder for links.json.")
    parser.add_argument("--profile", action="append", help="NAME:SMS[+HOG][@GPU], twice or more "
                        f"(default: {' '.join(PROFILES)}).")
    parser.add_argument("--trials", type=int, default=20, help="Launches timed per graph (median).")
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except UsageError as exc:
        print(f"bench.link_cost: error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    import torch

    from kernelfleet.costs.links import LinkTable
    from kernelfleet.plan.links import COPY_US, LINK_GBPS
    from kernelfleet.plan.slots import uniform_link
    from kernelfleet.profile.run import link_times, parse_profile

    specs = [parse_profile(p) for p in args.profile or PROFILES]
    if len(specs) < 2 or args.trials < 1:
        raise UsageError(f"give at least two --profile and --trials >= 1, got {len(specs)} and {args.trials}")
    gpu_folder(args.out, "the link is measured on the GPU the plans run on")
    links = link_times(specs, trials=args.trials)
    name = torch.cuda.get_device_name(specs[0].device)
    table = LinkTable(links, f"measured on {name}, profiles {', '.join(p for p in args.profile or PROFILES)} "
                             f"(bench.link_cost, {args.trials} trials)")
    table.save(args.out / "links.json")
    today = uniform_link(COPY_US, LINK_GBPS)
    print("| link | bytes | between kernels (µs) | queued (µs) | today's model (µs) |")
    print("|---|---|---|---|---|")
    for link in links:
        for n, between, queued in zip(link.between.sizes_bytes, link.between.seconds, link.queued.seconds):
            print(f"| {link.a}-{link.b} | {n} | {between * 1e6:.2f} | {queued * 1e6:.2f} "
                  f"| {today(n, link.a, link.b) * 1e6:.2f} |")
    for link in links:
        print(f"{link.a}-{link.b}: between kernels {link.between.seconds_per_copy * 1e6:.2f} µs + bytes at "
              f"{link.between.bytes_per_second / 1e9:.0f} GB/s; queued {link.queued.seconds_per_copy * 1e6:.2f} µs + "
              f"bytes at {link.queued.bytes_per_second / 1e9:.0f} GB/s; wait across devices "
              f"{link.wait_seconds * 1e6:.2f} µs (today's model: {COPY_US:g} µs + bytes at {LINK_GBPS:g} GB/s, no wait)")
    print(f"wrote {args.out / 'links.json'}\n{command_line()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
