// Tessera's C shim: only what Swift cannot call directly. Every symbol is prefixed `tessera_`.
#ifndef TESSERA_SHIM_H
#define TESSERA_SHIM_H

#include <malloc.h>  // malloc_trim: <malloc.h> is not part of Swift's Glibc module
#include <stddef.h>
#include <stdint.h>
#include <curl/curl.h>
#include <spawn.h>
#include <sys/socket.h>

// --- libcurl ---------------------------------------------------------------------------------
// Reason: curl_easy_setopt and curl_easy_getinfo are variadic, with no va_list form. libcurl is
// loaded on first use (dlopen, see CurlLibrary.swift), so each call passes the function as found
// by dlsym (`easy_setopt` / `easy_getinfo`); the shim keeps no state.

CURLcode tessera_curl_setopt_long(void *easy_setopt, CURL *handle, CURLoption option, long value);
CURLcode tessera_curl_setopt_string(void *easy_setopt, CURL *handle, CURLoption option, const char *value);
CURLcode tessera_curl_setopt_pointer(void *easy_setopt, CURL *handle, CURLoption option, void *value);
/// For CURLOPT_WRITEFUNCTION and CURLOPT_HEADERFUNCTION.
CURLcode tessera_curl_setopt_data_callback(void *easy_setopt, CURL *handle, CURLoption option,
                                           size_t (*callback)(char *, size_t, size_t, void *));
CURLcode tessera_curl_getinfo_long(void *easy_getinfo, CURL *handle, CURLINFO info, long *value);

// --- GNU extensions ----------------------------------------------------------------------------
// Reason: glibc declares these only under _GNU_SOURCE, which Swift's Glibc module does not define
// (swift-nio's CNIOLinux wraps accept4 for the same reason). Each calls the glibc function as is.

/// pipe2(2): both ends close-on-exec (and non-blocking with O_NONBLOCK) from the start.
int tessera_pipe2(int fds[2], int flags);
/// accept4(2): the connection is close-on-exec and non-blocking from the start.
int tessera_accept4(int fd, struct sockaddr *address, socklen_t *length, int flags);
/// posix_spawn_file_actions_addclosefrom_np (glibc 2.34): the child closes every descriptor from
/// `from` up before exec, without the parent walking /proc/self/fd.
int tessera_spawn_file_actions_addclosefrom(posix_spawn_file_actions_t *actions, int from);
/// memfd_create(2) with MFD_CLOEXEC | MFD_ALLOW_SEALING: an anonymous file in memory.
int tessera_memfd_create(const char *name);
/// fcntl(F_ADD_SEALS) with every seal (no write, grow, shrink, or further seals): the file's
/// content is fixed for good.
int tessera_memfd_seal(int fd);

// --- pidfd -------------------------------------------------------------------------------------
// Reason: Debian 12's glibc declares pidfd_open only in <sys/pidfd.h>, outside Swift's Glibc
// module; this wraps the glibc function as is. (Whether the process ended is a poll(2) on the
// pidfd, which Swift calls directly.)

/// pidfd_open(2) with PIDFD flags 0: a descriptor that stays bound to this process, never to one
/// that reuses its pid.
int tessera_pidfd_open(int pid);

#endif
