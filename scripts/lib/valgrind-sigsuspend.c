// Loaded (LD_PRELOAD) into programs the benchmark runs under valgrind, and nowhere else.
// Why: Debian 12's valgrind (3.19) writes into the signal mask a program hands to
// rt_sigsuspend, and libdispatch's dispatch_main() (where every async-main Swift program parks its
// main thread, tesserad among them) hands it a mask in read-only memory: valgrind dies of SIGSEGV.
// This sigsuspend passes the kernel a writable copy instead; what the program asked is unchanged.
#define _GNU_SOURCE
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

int sigsuspend(const sigset_t *mask) {
    sigset_t copy = *mask;
    return (int)syscall(SYS_rt_sigsuspend, &copy, _NSIG / 8);
}
