/* The pod infrastructure container: holds the pod's namespaces open.
 *
 * It must stay asleep forever, exit promptly on SIGINT/SIGTERM (the runtime
 * stops it that way), and reap any zombie that is reparented to it when the
 * pod shares its PID namespace.
 */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) { (void)sig; _exit(0); }

static void on_child(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(int argc, char **argv) {
    (void)argv;
    if (argc > 1) {
        /* Accept and ignore `-v`-style probes instead of sleeping forever. */
        return 0;
    }
    struct sigaction stop = {.sa_handler = on_stop};
    struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP};
    if (sigaction(SIGINT, &stop, NULL) || sigaction(SIGTERM, &stop, NULL) ||
        sigaction(SIGCHLD, &child, NULL)) {
        return 1;
    }
    for (;;) {
        pause();
    }
}
