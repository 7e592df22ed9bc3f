"""How the package's ROS commands start, spin and stop.

rclpy's own SIGINT handler shuts the context down at once: whatever the nodes log while they
close (the recorder's final counters, "memory closed") then fails with "publisher's context
is invalid", and a second Ctrl-C raises KeyboardInterrupt wherever the main thread happens to
be (inside the index save, say). Here rclpy installs no signal handler; the first SIGINT or
SIGTERM only asks the spin loop to end, the nodes close in order with bounded waits, and the
context is shut down last. A second signal says the node is still stopping; a third exits at
once (the index cache is written to a new file and renamed, so that leaves a valid cache or
none).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import rclpy
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor

from memory_node.core.secrets import mask_log_handlers, mask_secrets
from memory_node.ros import param_args

# How long the spin loop sleeps in the middleware between looks at the stop flag.
SPIN_SLICE_S = 0.1


class StopRequest:
    """Set by SIGINT/SIGTERM; counts signals so a third can end a stuck shutdown."""

    def __init__(self, prog: str) -> None:
        self.prog = prog
        self.event = threading.Event()
        self.signals = 0

    def __call__(self, signum: int, frame: Any) -> None:
        self.signals += 1
        if self.signals == 1:
            self.event.set()
        elif self.signals == 2:
            os.write(2, f"{self.prog}: still stopping (saving memory); a third signal "
                        "exits at once\n".encode())
        else:
            os._exit(128 + signum)

    def is_set(self) -> bool:
        return self.event.is_set()


def print_help_if_asked(argv: Sequence[str], usage: str) -> bool:
    """For commands whose arguments are ROS arguments: `--help` / `-h` before `--ros-args`
    prints the usage (no node, no files) and returns True."""
    args = list(argv[1:])
    if "--ros-args" in args:
        args = args[:args.index("--ros-args")]
    if "-h" in args or "--help" in args:
        print(usage.rstrip())
        return True
    return False


def init_ros(prog: str, args: Sequence[str] | None = None, *, nodes: Sequence[str] = (),
             notes: Sequence[str] = (),
             declared: Mapping[str, Collection[str]] | None = None) -> StopRequest:
    """rclpy.init without rclpy's signal handlers, and ours for SIGINT and SIGTERM.

    `nodes`: the names of the process's nodes; a plain `-p` then wins over the parameter
    files' sections for them (a one-node process follows a `__node:=` remap), and the start
    line says where the parameters come from, with `notes` on values set otherwise, naming
    a value only for the nodes that `declared` says read it (see param_args)."""
    from rclpy.logging import get_logger
    from rclpy.signals import SignalHandlerOptions

    line = ""
    if nodes and args is not None:
        if len(nodes) == 1:
            nodes = [param_args.node_name(args, nodes[0])]
        cmdline = param_args.command_line_wins(list(args), nodes, declared)
        args, line = cmdline.args, cmdline.start_line(notes)
    rclpy.init(args=list(args) if args is not None else None,
               signal_handler_options=SignalHandlerOptions.NO)
    mask_log_handlers()  # the core's own warnings (logging) reach stderr too
    if line:
        get_logger(prog.replace("-", "_")).info(mask_secrets(line))
    stop = StopRequest(prog)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    return stop


def spin_nodes(nodes: list, stop: StopRequest, executor: Any = None, *,
               extra: list | None = None, before_close: Any = None) -> None:
    """Spin until a stop signal, then close every node and shut rclpy down.

    `extra` is a list of (executor, nodes) spun on threads of their own, e.g. the recorder on a
    single-threaded executor beside the server's multi-threaded one. Nodes are closed in
    order: extra ones first, so the recorder's last keyframes land before the engine closes.
    """
    executor = executor or MultiThreadedExecutor(num_threads=4)
    for n in nodes:
        executor.add_node(n)
    groups = list(extra or [])
    threads = []
    for ex, ns in groups:
        for n in ns:
            ex.add_node(n)
        th = threading.Thread(target=_spin_until, args=(ex, stop), daemon=True)
        th.start()
        threads.append(th)
    try:
        _spin_until(executor, stop)
    finally:
        stop.event.set()
        for th in threads:
            th.join(timeout=2.0)
        for n in [n for _, ns in groups for n in ns] + list(nodes):
            closer = getattr(n, "close_engine", None) or getattr(n, "close", None)
            if closer is not None:
                try:
                    closer()
                except Exception as exc:  # noqa: BLE001
                    print(f"{stop.prog}: error while closing {n.get_name()}: {exc}",
                          file=sys.stderr)
        for ex, ns in groups:
            for n in ns:
                ex.remove_node(n)
                n.destroy_node()
            ex.shutdown(timeout_sec=1.0)
        for n in nodes:
            executor.remove_node(n)
            n.destroy_node()
        executor.shutdown(timeout_sec=1.0)
        rclpy.try_shutdown()


def _spin_until(executor: Any, stop: StopRequest) -> None:
    try:
        while not stop.is_set() and rclpy.ok():
            executor.spin_once(timeout_sec=SPIN_SLICE_S)
    except (KeyboardInterrupt, ExternalShutdownException):
        stop.event.set()
