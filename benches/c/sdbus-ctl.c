/* sdbus-ctl: the sd-bus baseline of `drover-bench ctl`, standing in for bluechictl
 * (a small C program on sd-bus, not packaged for Debian). It makes the D-Bus calls
 * bluechictl makes for two commands, and prints what bluechictl prints:
 *
 *   sdbus-ctl ADDRESS status            Controller.ListNodes, the status table
 *   sdbus-ctl ADDRESS start NODE UNIT   match JobRemoved, Node.StartUnit(UNIT, "replace")
 *                                       on the locally escaped node path, wait for the job
 *
 * Exit 0 on success (for start: whatever the job result), 1 on any error.
 * Built by the bench with `cc -O2 sdbus-ctl.c -lsystemd` (needs libsystemd-dev). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-bus.h>

#define SERVICE "org.eclipse.bluechi"
#define CONTROLLER "/org/eclipse/bluechi"

struct job {
	const char *path;
	char *result;
};

static int on_removed(sd_bus_message *m, void *userdata, sd_bus_error *err) {
	struct job *job = userdata;
	uint32_t id;
	const char *path, *node, *unit, *result;
	(void)err;
	if (sd_bus_message_read(m, "uosss", &id, &path, &node, &unit, &result) < 0)
		return 0;
	if (job->path && strcmp(path, job->path) == 0)
		job->result = strdup(result);
	return 0;
}

static int status(sd_bus *bus) {
	sd_bus_error err = SD_BUS_ERROR_NULL;
	sd_bus_message *reply = NULL;
	const char *name, *path, *state, *ip;
	int r = sd_bus_call_method(bus, SERVICE, CONTROLLER, SERVICE ".Controller", "ListNodes",
				   &err, &reply, "");
	if (r < 0) {
		fprintf(stderr, "ListNodes: %s\n", err.message ? err.message : strerror(-r));
		return 1;
	}
	printf("%-30.30s|%-10.10s|%-24.24s|%-28.28s\n", "NODE", "STATE", "IP", "LAST SEEN");
	printf("==========================================================================================\n");
	r = sd_bus_message_enter_container(reply, 'a', "(soss)");
	while (r >= 0 && sd_bus_message_read(reply, "(soss)", &name, &path, &state, &ip) > 0)
		printf("%-30.30s|%-10.10s|%-24.24s|%-28.28s\n", name, state, ip,
		       strcmp(state, "online") == 0 ? "now" : "never");
	sd_bus_message_unref(reply);
	return 0;
}

static int start(sd_bus *bus, const char *node, const char *unit) {
	sd_bus_error err = SD_BUS_ERROR_NULL;
	sd_bus_message *reply = NULL;
	char *node_path = NULL;
	const char *job_path;
	struct job job = {0};
	int r = sd_bus_match_signal(bus, NULL, SERVICE, CONTROLLER, SERVICE ".Controller",
				    "JobRemoved", on_removed, &job);
	if (r < 0 || sd_bus_path_encode("/org/eclipse/bluechi/node", node, &node_path) < 0)
		return 1;
	r = sd_bus_call_method(bus, SERVICE, node_path, SERVICE ".Node", "StartUnit", &err,
			       &reply, "ss", unit, "replace");
	if (r < 0) {
		fprintf(stderr, "StartUnit: %s\n", err.message ? err.message : strerror(-r));
		return 1;
	}
	if (sd_bus_message_read(reply, "o", &job_path) < 0)
		return 1;
	job.path = job_path;
	while (!job.result) {
		r = sd_bus_process(bus, NULL);
		if (r < 0)
			return 1;
		if (r == 0 && sd_bus_wait(bus, UINT64_MAX) < 0)
			return 1;
	}
	printf("Unit %s StartUnit operation result: %s\n", unit, job.result);
	return 0;
}

int main(int argc, char **argv) {
	sd_bus *bus = NULL;
	if (argc < 3 || sd_bus_new(&bus) < 0 || sd_bus_set_address(bus, argv[1]) < 0 ||
	    sd_bus_set_bus_client(bus, 1) < 0 || sd_bus_start(bus) < 0) {
		fprintf(stderr, "usage: sdbus-ctl ADDRESS status | start NODE UNIT (or no bus)\n");
		return 1;
	}
	if (strcmp(argv[2], "status") == 0)
		return status(bus);
	if (strcmp(argv[2], "start") == 0 && argc == 5)
		return start(bus, argv[3], argv[4]);
	fprintf(stderr, "unknown command\n");
	return 1;
}
