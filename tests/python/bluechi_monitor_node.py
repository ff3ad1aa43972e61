"""Drives drover's Monitor and Node API with BlueChi's own Python bindings
(PyPI `bluechi`, on dasbus, whose proxies come from the server's Introspect XML).

Usage: bluechi_monitor_node.py BUS_ADDRESS
Expects a sandbox with nodes node1 and node2 online; on node1 the units
pyweb.service (a long-running service, stopped) and pyinst.service (a service
with an [Install] section, disabled). Exits non-zero with a message on the
first mismatch; prints "all checks passed" at the end.
"""

import sys

from dasbus.connection import AddressedMessageBus
from dasbus.error import DBusError
from dasbus.loop import EventLoop
from gi.repository import GLib

from bluechi.api import Controller, Monitor, Node, Variant
from bluechi.ext import Unit

TIMEOUT_MS = 15000


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def native(v):
    """A property value as Python (dasbus keeps `v` results as GLib.Variant)."""
    return v.unpack() if hasattr(v, "unpack") else v


def monitor_checks(bus, controller, node):
    path = controller.create_monitor()
    check(str(path).startswith("/org/eclipse/bluechi/monitor/"), f"create_monitor -> {path}")
    monitor = Monitor(path, bus=bus)

    events = []
    loop = EventLoop()
    step = {"n": 0}

    def record(kind):
        def cb(*args):
            events.append((kind,) + tuple(args))
            progress()

        return cb

    def progress():
        states = [e for e in events if e[0] == "state" and e[2] == "pyweb.service"]
        if step["n"] == 0 and any(e[3] == "active" and e[5] == "real" for e in states):
            step["n"] = 1
            node.stop_unit("pyweb.service", "replace")
        elif step["n"] == 1 and any(e[3] == "inactive" and e[5] == "real" for e in states):
            step["n"] = 2
            loop.quit()

    monitor.on_unit_new(record("new"))
    monitor.on_unit_removed(record("removed"))
    monitor.on_unit_state_changed(record("state"))
    monitor.on_unit_properties_changed(record("props"))

    sub = monitor.subscribe("node1", "pyweb.service")
    check(sub > 0, f"subscribe -> id {sub}")
    other = monitor.subscribe_list("node2", ["pyweb.service", "other.service"])
    check(other > 0 and other != sub, f"subscribe_list -> id {other}")

    def start():
        node.start_unit("pyweb.service", "replace")
        return False

    timer = {"fired": False}

    def give_up():
        timer["fired"] = True
        loop.quit()
        return False

    GLib.timeout_add(200, start)
    timer_id = GLib.timeout_add(TIMEOUT_MS, give_up)
    loop.run()
    if not timer["fired"]:
        GLib.source_remove(timer_id)
    states = [e[1:] for e in events if e[0] == "state"]
    check(step["n"] == 2, f"saw pyweb start and stop through on_unit_state_changed: {states}")
    check(
        all(e[1] == "node1" and e[2] == "pyweb.service" for e in events),
        "only the subscribed node and unit",
    )
    check(
        any(e[0] == "props" and e[3] == "org.freedesktop.systemd1.Unit" for e in events),
        "on_unit_properties_changed with systemd's Unit interface",
    )
    check(any(e[0] == "new" and e[3] == "real" for e in events), "on_unit_new (real)")

    monitor.unsubscribe(sub)
    try:
        monitor.unsubscribe(sub)
        check(False, "unsubscribing twice raises")
    except DBusError as e:
        check("not found" in str(e), f"unknown subscription id: {e}")
    monitor.close()
    try:
        monitor.close()
        check(False, "closing twice raises")
    except DBusError as e:
        print(f"ok: a closed monitor refuses Close: {e!r}")


def node_checks(bus, controller, node):
    unit = "pyweb.service"
    props = node.get_unit_properties(unit, "org.freedesktop.systemd1.Unit")
    check(native(props["Id"]) == unit, "get_unit_properties Id")
    check(native(props["LoadState"]) == "loaded", "get_unit_properties LoadState")
    state = native(node.get_unit_property(unit, "org.freedesktop.systemd1.Unit", "ActiveState"))
    check(state == "inactive", f"get_unit_property ActiveState {state}")

    node.set_unit_properties(unit, True, [("Description", Variant("s", "set from python"))])
    desc = native(node.get_unit_property(unit, "org.freedesktop.systemd1.Unit", "Description"))
    check(desc == "set from python", f"set_unit_properties Description -> {desc}")

    ext = Unit("node1", bus=bus)
    check(node.get_unit_file_state("pyinst.service") == "disabled", "pyinst starts disabled")
    resp = ext.enable_unit_files(["pyinst.service"])
    check(resp.carries_install_info, "enable: install info")
    check(
        any(c.change_type == "symlink" and c.symlink_file.endswith("default.target.wants/pyinst.service")
            for c in resp.changes),
        f"enable: symlink created {resp.changes}",
    )
    check(node.get_unit_file_state("pyinst.service") == "enabled", "get_unit_file_state enabled")
    files = dict(node.list_unit_files())
    check(
        any(p.endswith("/pyinst.service") and s == "enabled" for p, s in files.items()),
        "list_unit_files shows it enabled",
    )
    changes = ext.disable_unit_files(["pyinst.service"])
    check(any(c.change_type == "unlink" for c in changes), f"disable: unlink {changes}")
    check(node.get_unit_file_state("pyinst.service") == "disabled", "disabled again")

    check(sorted(controller.list_unit_files().keys()) == ["node1", "node2"], "controller list_unit_files")
    check(node.get_default_target().endswith(".target"), "get_default_target")
    check(ext.start_unit(unit) == "done", "ext.Unit start_unit -> done")
    node.kill_unit(unit, "main", 9)
    loop_wait(
        "kill_unit SIGKILL -> failed",
        lambda: native(node.get_unit_property(unit, "org.freedesktop.systemd1.Unit", "ActiveState"))
        == "failed",
    )
    node.reset_failed_unit(unit)
    state = native(node.get_unit_property(unit, "org.freedesktop.systemd1.Unit", "ActiveState"))
    check(state == "inactive", f"reset_failed_unit -> {state}")

    controller.set_log_level("INFO")
    node.set_log_level("INFO")
    check(controller.log_level == "INFO", f"controller log_level {controller.log_level}")
    # Bad arguments raise and change nothing.
    try:
        node.kill_unit(unit, "nobody", 15)
        check(False, "a bad whom raises")
    except DBusError as e:
        print(f"ok: bad whom refused: {e!r}")
    try:
        controller.set_log_level("LOUD")
        check(False, "a bad log level raises")
    except DBusError as e:
        print(f"ok: bad log level refused: {e!r}")
    check(controller.log_level == "INFO", "log level unchanged")
    try:
        Node("nosuchnode", bus=bus)
        check(False, "an unknown node raises")
    except DBusError as e:
        check("nosuchnode" in str(e), f"unknown node: {e}")
    check(controller.log_target in ("journald", "stderr", "stderr-full"), "controller log_target")


def loop_wait(what, cond, timeout_ms=TIMEOUT_MS):
    """Runs a loop until `cond()` holds (polled) or the timeout; leaves no timer."""
    loop = EventLoop()
    state = {"ok": False, "timer": None}

    def poll():
        if cond():
            state["ok"] = True
            loop.quit()
            return False
        return True

    def give_up():
        state["timer"] = None
        loop.quit()
        return False

    poll_id = GLib.timeout_add(50, poll)
    state["timer"] = GLib.timeout_add(timeout_ms, give_up)
    loop.run()
    if state["timer"] is not None:
        GLib.source_remove(state["timer"])
    if not state["ok"]:
        GLib.source_remove(poll_id)
    check(state["ok"], what)


def main():
    bus = AddressedMessageBus(sys.argv[1])
    controller = Controller(bus=bus)
    node = Node("node1", bus=bus)
    monitor_checks(bus, controller, node)
    node_checks(bus, controller, node)
    print("all checks passed")


if __name__ == "__main__":
    main()
