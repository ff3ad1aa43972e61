"""BlueChi's own Python bindings against a drover manager that stands by
(docs/ha.md, "A standby refuses, naming the leader").

Usage: bluechi_standby.py BUS_ADDRESS LEADER
LEADER is what the standby must name (HOST:PORT). Every Controller call the
bindings make raises a D-Bus error whose text names the leader and its epoch,
so a BlueChi client pointed at the wrong manager says where to go. Exits
non-zero with a message on the first mismatch.
"""

import sys

from dasbus.connection import AddressedMessageBus
from dasbus.error import DBusError
from bluechi.api import Controller


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def refused(call, what, leader):
    try:
        result = call()
    except DBusError as e:
        text = str(e)
        check(
            "stands by" in text and f"the leader is {leader} (epoch " in text,
            f"{what} refused naming the leader: {text}",
        )
        return
    check(False, f"{what} answered on a standby: {result!r}")


def main():
    bus = AddressedMessageBus(sys.argv[1])
    leader = sys.argv[2]
    controller = Controller(bus=bus)
    refused(controller.list_nodes, "list_nodes", leader)
    refused(controller.list_units, "list_units", leader)
    refused(lambda: controller.get_node("node1"), "get_node", leader)
    refused(lambda: controller.create_monitor(), "create_monitor", leader)
    print("all checks passed")


if __name__ == "__main__":
    main()
