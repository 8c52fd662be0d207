import CTesseraShim

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
