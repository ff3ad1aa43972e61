"""Drives a drover manager with BlueChi's own Python bindings (PyPI `bluechi`,
built on dasbus, which builds every proxy from the server's Introspect XML).

Usage: bluechi_compat.py BUS_ADDRESS
Expects a sandbox with nodes node1 and node2 online, and on node1 the units
compat-ok.service (oneshot, succeeds) and compat-slow.service (oneshot that
sleeps). Exits non-zero with a message on the first mismatch.
"""

import sys
import time

from dasbus.connection import AddressedMessageBus
from dasbus.error import DBusError
from bluechi.api import Controller, Job, Node
from bluechi.ext import Unit


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def main():
    bus = AddressedMessageBus(sys.argv[1])

    controller = Controller(bus=bus)
    nodes = controller.list_nodes()
    names = [n[0] for n in nodes]
    check(names == ["node1", "node2"], f"list_nodes names {names}")
    check(all(n[2] == "online" for n in nodes), "every node online")
    check(str(nodes[0][1]) == "/org/eclipse/bluechi/node/node1", "node object path")
    check(controller.status == "up", f"controller status {controller.status}")
    check(controller.get_node("node2") == "/org/eclipse/bluechi/node/node2", "get_node")
    try:
        controller.get_node("nosuchnode")
        check(False, "get_node of an unknown node raises")
    except DBusError as e:
        check("nosuchnode" in str(e), f"unknown node raises a clear error: {e}")

    all_units = controller.list_units()
    check(sorted(all_units.keys()) == ["node1", "node2"], "controller list_units keyed by node")

    node = Node("node1", bus=bus)
    check(node.name == "node1", "node name property")
    check(node.status == "online", "node status property")
    check(node.peer_ip == "127.0.0.1", f"peer ip {node.peer_ip}")
    check(node.last_seen_timestamp > 0, "last seen timestamp")
    check(node.last_seen_timestamp_monotonic > 0, "last seen monotonic")
    units = node.list_units()
    check(any(u[0] == "init.scope" for u in units), "node list_units has init.scope")
    check(all(len(u) == 10 for u in units), "unit tuples have 10 fields")

    unit = Unit("node1", bus=bus)
    check(unit.start_unit("compat-ok.service") == "done", "ext.Unit start_unit -> done")
    check(unit.restart_unit("compat-ok.service") == "done", "ext.Unit restart_unit -> done")
    check(unit.stop_unit("compat-ok.service") == "done", "ext.Unit stop_unit -> done")

    job_path = node.start_unit("compat-slow.service", "replace")
    job = Job(job_path, bus=bus)
    check(job.unit == "compat-slow.service", "job unit")
    check(job.node == "node1", "job node")
    check(job.job_type == "start", "job type")
    check(job.id > 0 and job_path.endswith(f"/{job.id}"), "job id matches its path")
    deadline = time.time() + 10
    while job.state != "running" and time.time() < deadline:
        time.sleep(0.05)
    check(job.state == "running", "job state running")
    job.cancel()
    print("all checks passed")


if __name__ == "__main__":
    main()
