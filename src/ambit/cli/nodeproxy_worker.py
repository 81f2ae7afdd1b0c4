"""``python -m ambit.cli.nodeproxy_worker --control-fd N``: one worker process of a node proxy.

The node proxy (:mod:`ambit.inpod.workers`) starts it with one end of a socketpair as fd ``N`` and writes its
settings there; :func:`ambit.inpod.worker_process.run_worker` serves. Not a command for people: ``ambit nodeproxy
--workers`` starts these.

Exit statuses: 0 when the worker ends, 1 when it cannot start (a bad control socket or settings, no usable native
extension that the settings ask for: one line on stderr), 2 for a bad command line.
"""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ambit.cli.nodeproxy_worker")
    parser.add_argument("--control-fd", type=int, required=True, help="The control socket from the node proxy.")
    args = parser.parse_args(argv)
    from ambit.inpod.worker_channel import ChannelError, read_settings

    try:
        control = socket.socket(fileno=args.control_fd)
    except OSError as exc:
        print(f"ambit node proxy worker: fd {args.control_fd}: {exc}", file=sys.stderr)
        return 1
    try:
        control.setblocking(True)
        settings = read_settings(control)
    except (OSError, ChannelError) as exc:
        control.close()
        print(f"ambit node proxy worker: {exc}", file=sys.stderr)
        return 1
    from ambit import native
    from ambit.cli.process_logging import configure_logging
    from ambit.heap import tune_collector
    from ambit.inpod import eventloop
    from ambit.inpod.allocator import tune_allocator
    from ambit.inpod.worker_process import run_worker

    try:
        native.selection()
    except native.NativeError as exc:
        print(f"ambit node proxy worker: {exc}", file=sys.stderr)
        return 1
    configure_logging()
    tune_allocator()
    tune_collector()
    control.setblocking(False)
    eventloop.run(lambda: run_worker(settings, control), settings.event_loop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
