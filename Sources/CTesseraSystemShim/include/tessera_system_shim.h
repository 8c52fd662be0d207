// Tessera's system-call shim: only what Swift cannot call directly, for the system layer
// (TesseraSystem) and the layers above it. Every symbol is prefixed `tessera_`. No library is
// linked for it beyond glibc.
#ifndef TESSERA_SYSTEM_SHIM_H
#define TESSERA_SYSTEM_SHIM_H

#include <malloc.h>  // malloc_trim: <malloc.h> is not part of Swift's Glibc module
#include <spawn.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

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
/// renameat2(2) with RENAME_NOREPLACE (relative to the working directory): `to` is made only if
/// it is not there, atomically; EEXIST if it is, EINVAL where the file system cannot.
int tessera_rename_noreplace(const char *from, const char *to);
/// pthread_setname_np on the calling thread (at most 15 bytes; longer names are cut), for ps,
/// gdb and crash reports.
int tessera_name_this_thread(const char *name);

// --- pidfd -------------------------------------------------------------------------------------
// Reason: Debian 12's glibc declares pidfd_open only in <sys/pidfd.h>, outside Swift's Glibc
// module; this wraps the glibc function as is. (Whether the process ended is a poll(2) on the
// pidfd, which Swift calls directly.)

/// pidfd_open(2) with PIDFD flags 0: a descriptor that stays bound to this process, never to one
/// that reuses its pid.
int tessera_pidfd_open(int pid);

#endif
