#define _GNU_SOURCE  // pipe2, accept4, posix_spawn_file_actions_addclosefrom_np, memfd_create,
                     // F_ADD_SEALS, renameat2, pthread_setname_np
#include <sys/pidfd.h>
#include "tessera_system_shim.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int tessera_pipe2(int fds[2], int flags) { return pipe2(fds, flags); }

int tessera_accept4(int fd, struct sockaddr *address, socklen_t *length, int flags) {
  return accept4(fd, address, length, flags);
}

int tessera_spawn_file_actions_addclosefrom(posix_spawn_file_actions_t *actions, int from) {
  return posix_spawn_file_actions_addclosefrom_np(actions, from);
}

int tessera_memfd_create(const char *name) { return memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING); }

int tessera_memfd_seal(int fd) {
  return fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);
}

int tessera_rename_noreplace(const char *from, const char *to) {
  return renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE);
}

int tessera_name_this_thread(const char *name) {
  char shortened[16];
  strncpy(shortened, name, sizeof shortened - 1);
  shortened[sizeof shortened - 1] = '\0';
  return pthread_setname_np(pthread_self(), shortened);
}

int tessera_pidfd_open(int pid) { return pidfd_open(pid, 0); }
