/* maxrss: run a command, print its peak RSS in KiB (ru_maxrss from wait4) on stderr's
 * last line, exit with its status. `drover-bench ctl` measures peak RSS through this
 * small process because a child forked from the (large) bench inherits the bench's
 * high-water mark into ru_maxrss; a child forked from this program starts near zero. */
#include <stdio.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
	struct rusage ru;
	int status;
	pid_t pid;
	if (argc < 2)
		return 2;
	pid = fork();
	if (pid < 0)
		return 2;
	if (pid == 0) {
		execvp(argv[1], argv + 1);
		_exit(127);
	}
	if (wait4(pid, &status, 0, &ru) != pid)
		return 2;
	fprintf(stderr, "maxrss %ld\n", ru.ru_maxrss);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 2;
}
