#define _GNU_SOURCE  // pipe2, accept4, posix_spawn_file_actions_addclosefrom_np, memfd_create, F_ADD_SEALS
#include <sys/pidfd.h>
#include "tessera_shim.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

typedef CURLcode (*tessera_easy_setopt_fn)(CURL *, CURLoption, ...);
typedef CURLcode (*tessera_easy_getinfo_fn)(CURL *, CURLINFO, ...);

CURLcode tessera_curl_setopt_long(void *easy_setopt, CURL *handle, CURLoption option, long value) {
  return ((tessera_easy_setopt_fn)easy_setopt)(handle, option, value);
}

CURLcode tessera_curl_setopt_string(void *easy_setopt, CURL *handle, CURLoption option, const char *value) {
  return ((tessera_easy_setopt_fn)easy_setopt)(handle, option, value);
}

CURLcode tessera_curl_setopt_pointer(void *easy_setopt, CURL *handle, CURLoption option, void *value) {
  return ((tessera_easy_setopt_fn)easy_setopt)(handle, option, value);
}

CURLcode tessera_curl_setopt_data_callback(void *easy_setopt, CURL *handle, CURLoption option,
                                           size_t (*callback)(char *, size_t, size_t, void *)) {
  return ((tessera_easy_setopt_fn)easy_setopt)(handle, option, callback);
}

CURLcode tessera_curl_getinfo_long(void *easy_getinfo, CURL *handle, CURLINFO info, long *value) {
  return ((tessera_easy_getinfo_fn)easy_getinfo)(handle, info, value);
}

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

int tessera_pidfd_open(int pid) { return pidfd_open(pid, 0); }

