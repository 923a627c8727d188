"""`m27 exporter`: serve the node's GPU and pipeline metrics to Prometheus.

    m27 exporter [--listen 127.0.0.1:9427] [--interval 5] [--node NAME] [--once]

Binds 127.0.0.1 unless told otherwise: the metrics name runs and steps, so exposing them
beyond the host is a choice (``--listen 0.0.0.0:9427``). ``--once`` prints one scrape in
the text exposition format and exits, for a quick look without Prometheus.
"""

from __future__ import annotations

import argparse
import signal
import sys

from m27._exceptions import ConfigError, M27Error
from m27.cli.commands import SUMMARY
from m27.cli.commands._options import seconds
from m27.signals import stop_event


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "exporter",
        help=SUMMARY["exporter"],
        description="A Prometheus exporter: per-GPU utilization, memory, temperature, power, "
        "energy, clocks and throttle reasons (NVML, or M27_GPUS=sim:N), per-process GPU use "
        "with run/step labels, and the queue, leases, runs, checkpoints and energy per step "
        "from the node's event log. It also records each step's GPU energy in the log.",
    )
    p.add_argument(
        "--listen",
        default=None,
        metavar="HOST:PORT",
        help="address to serve /metrics on (default 127.0.0.1:9427)",
    )
    p.add_argument(
        "--interval",
        type=seconds(most=3600),
        default=5.0,
        metavar="SECONDS",
        help="sample between scrapes at least this often, for energy and idle accounting "
        "(default 5; 0 samples only when scraped)",
    )
    p.add_argument("--node", default=None, help="the node label (default: the host name)")
    p.add_argument(
        "--no-energy-events",
        action="store_true",
        help="do not record StepEnergyMeasured events (when another exporter on this node does)",
    )
    p.add_argument("--once", action="store_true", help="print one scrape to stdout and exit")
    p.set_defaults(func=run)


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` (127.0.0.1) or ``[::1]:PORT``; ConfigError otherwise."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(f"--listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9427")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port_text)


def run(args: argparse.Namespace) -> int:
    from prometheus_client import generate_latest

    from m27.gpu import detect
    from m27.monitoring.exporter import DEFAULT_LISTEN, Sampler, build_registry
    from m27.monitoring.server import serve
    from m27.store.sqlite import open_store

    host, port = parse_listen(args.listen or DEFAULT_LISTEN)
    store = open_store()
    backend = detect()
    sampler = Sampler(backend, store, node=args.node, record_energy=not args.no_energy_events)
    registry = build_registry(sampler)
    try:
        if args.once:
            sys.stdout.write(generate_latest(registry).decode())
            return 0
        try:
            server, thread = serve(registry, host, port)
        except OSError as exc:  # in use, not this host's address, an unknown name
            raise M27Error(
                f"cannot listen on {host}:{port}: {exc.strerror or exc} "
                "(choose another address with --listen HOST:PORT)",
                host=host,
                port=port,
            ) from exc
        print(f"m27 exporter: http://{host}:{port}/metrics ({backend.kind} GPUs)", flush=True)
        stop = stop_event((signal.SIGTERM, signal.SIGINT))
        wait = args.interval if args.interval > 0 else None
        while not stop.wait(wait):
            if wait is not None:
                sampler.tick_if_stale(wait)
        server.shutdown()
        thread.join(timeout=5)
        return 0
    finally:
        sampler.close()
        store.close()
