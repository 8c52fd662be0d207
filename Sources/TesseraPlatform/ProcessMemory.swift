import CTesseraSystemShim
import Glibc

/// glibc's allocator, tuned for a long-running daemon whose threads come and go (one per HTTP
/// request, per sign-in listener, per keyring call).
public enum ProcessMemory {
  /// At most two malloc arenas. glibc gives threads arenas of their own (up to eight per core),
  /// and each keeps what it once held: after bursts of requests RSS grew in steps of megabytes and
  /// never came back. Two serve tesserad's few concurrent threads without contention that shows.
  public static func limitArenas() {
    _ = mallopt(M_ARENA_MAX, 2)
    // Blocks of 64 KiB and more (a big message's buffers) come from mmap and go straight back to
    // the system when freed, instead of fragmenting the heap (glibc's threshold otherwise rises
    // to the largest block freed, up to 32 MiB).
    _ = mallopt(M_MMAP_THRESHOLD, 64 * 1024)
  }

  /// Hands memory that is free but still held back to the system (glibc keeps it otherwise):
  /// after a big keyring load, and after each maintenance pass.
  public static func releaseFreed() {
    _ = malloc_trim(0)
  }
}

/// Descriptor limits for a daemon that keeps one pidfd per calling connection.
public enum ProcessLimits {
  /// Raises the soft RLIMIT_NOFILE to the hard limit (systemd gives services 1024 soft, 512 Ki
  /// hard): 4096 pinned callers plus sockets and the keyring's connection must fit. tesserad
  /// never uses select(2), whose 1024-descriptor ceiling is why the soft limit stays low.
  public static func raiseFileLimit() {
    var limit = rlimit()
    let resource = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
    guard getrlimit(resource, &limit) == 0, limit.rlim_cur < limit.rlim_max else { return }
    limit.rlim_cur = max(limit.rlim_cur, min(limit.rlim_max, 65536))
    _ = setrlimit(resource, &limit)
  }

  /// No core file (RLIMIT_CORE 0, soft and hard, as ssh-agent sets it): the daemon's memory holds
  /// every token, and a crash must not leave a copy of them on disk, unsealed (the kernel's core
  /// file, or systemd-coredump, which honours the limit). Crash backtraces (Swift's, into the
  /// log) still work. Returns false when the kernel refused.
  @discardableResult
  public static func forbidCoreDumps() -> Bool {
    var none = rlimit(rlim_cur: 0, rlim_max: 0)
    return setrlimit(__rlimit_resource_t(RLIMIT_CORE.rawValue), &none) == 0
  }
}
