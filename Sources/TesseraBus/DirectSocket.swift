import CSystemd
import Glibc
import SystemPackage
import TesseraInterface
import TesseraSystem

/// tesserad's own socket, `$XDG_RUNTIME_DIR/tessera/bus`: peer-to-peer D-Bus with no bus daemon
/// in between. Both sides use this: the daemon to listen (or take the socket systemd passes it),
/// clients to find it and to check, before sending a byte, that the user's own broker is behind
/// it.
public enum DirectSocket {
  /// The environment variable that names another socket.
  public static let environmentVariable = "TESSERA_SOCKET"

  /// Where the socket is: `$TESSERA_SOCKET`, else `$XDG_RUNTIME_DIR/tessera/bus`, else
  /// `/run/user/UID/tessera/bus` when that runtime directory exists; nil when there is no runtime
  /// directory at all.
  public static func path(environment: [String: String]) -> String? {
    if let named = environment[environmentVariable], !named.isEmpty { return named }
    if let runtime = environment["XDG_RUNTIME_DIR"], runtime.hasPrefix("/") { return runtime + "/tessera/bus" }
    let fallback = "/run/user/\(getuid())"
    var st = stat()
    guard lstat(fallback, &st) == 0, st.st_mode & S_IFMT == S_IFDIR, st.st_uid == getuid() else { return nil }
    return fallback + "/tessera/bus"
  }

  /// The directory holding `path`.
  public static func directory(of path: String) -> String {
    guard let slash = path.lastIndex(of: "/") else { return "." }
    return slash == path.startIndex ? "/" : String(path[..<slash])
  }

  /// Why the socket at `path` must not be trusted (its directory or the socket belongs to someone
  /// else, or others may write to the directory and so replace the socket), or nil when it is the
  /// user's own. Throws ENOENT-like errors as `SystemCallError` when it is not there at all.
  ///
  /// A socket in a shared sticky directory (`/tmp`, where ssh puts a forward's socket on the
  /// remote host: `tessera forward`) is the user's own when the directory belongs to root or the
  /// user and the socket is the user's with no permission for others: in a sticky directory only
  /// its owner may remove or replace it.
  public static func checkOwnership(_ path: String) throws(SystemCallError) -> String? {
    let me = getuid()
    let dir = directory(of: path)
    var st = stat()
    try Syscall.check("stat(\(dir))") { lstat(dir, &st) }
    if st.st_mode & S_IFMT != S_IFDIR { return "\(dir) is not a directory" }
    if st.st_mode & 0o1000 != 0 && (st.st_uid == 0 || st.st_uid == me) {
      try Syscall.check("stat(\(path))") { lstat(path, &st) }
      if st.st_mode & S_IFMT != S_IFSOCK { return "\(path) is not a socket" }
      if st.st_uid != me { return "\(path) belongs to user \(st.st_uid), not to you (user \(me))" }
      if st.st_mode & 0o077 != 0 {
        return
          "others may connect to \(path) (mode \(String(st.st_mode & 0o777, radix: 8))) in the shared directory \(dir); a forward's socket is 0600 (sshd's StreamLocalBindMask)"
      }
      return nil
    }
    if st.st_uid != me {
      return "its directory \(dir) belongs to user \(st.st_uid), not to you (user \(me))"
    }
    if st.st_mode & 0o022 != 0 {
      return
        "its directory \(dir) may be written by others (mode \(String(st.st_mode & 0o777, radix: 8))), who could put their own socket there; run `chmod 700 \(dir)`"
    }
    try Syscall.check("stat(\(path))") { lstat(path, &st) }
    if st.st_mode & S_IFMT != S_IFSOCK { return "\(path) is not a socket" }
    if st.st_uid != me { return "\(path) belongs to user \(st.st_uid), not to you (user \(me))" }
    return nil
  }

  /// Whether two paths name the same file (device and inode, links not followed).
  public static func sameFile(_ a: String, _ b: String) -> Bool {
    var x = stat()
    var y = stat()
    return lstat(a, &x) == 0 && lstat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino
  }

  /// Whether `path` is in a shared sticky directory, where only a forward's socket can be (tesserad
  /// listens only in a directory of the user's own): its listener is ssh's, not tessera.service.
  public static func isInSharedDirectory(_ path: String) -> Bool {
    var st = stat()
    return lstat(directory(of: path), &st) == 0 && st.st_mode & 0o1000 != 0 && st.st_mode & 0o002 != 0
  }

  /// The credentials the kernel recorded for the peer of a connected Unix socket.
  public struct PeerCredentials: Sendable, Equatable {
    public var pid: UInt32
    public var uid: UInt32
    public var gid: UInt32
  }

  /// SO_PEERCRED: who connected (or, on a client's socket, who listens), as the kernel saw it at
  /// connect time.
  public static func peerCredentials(_ fd: Int32) throws(SystemCallError) -> PeerCredentials {
    // struct ucred { pid_t pid; uid_t uid; gid_t gid; } (a GNU struct Swift does not import).
    var cred: (Int32, UInt32, UInt32) = (0, 0, 0)
    var length = socklen_t(MemoryLayout<(Int32, UInt32, UInt32)>.size)
    try Syscall.check("getsockopt(SO_PEERCRED)") { getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) }
    return PeerCredentials(pid: UInt32(bitPattern: cred.0), uid: cred.1, gid: cred.2)
  }

  /// SO_PEERPIDFD (Linux 6.5): a pidfd for the very process that connected, so a pid reused since
  /// cannot be mistaken for it. nil where the kernel lacks it.
  public static func peerPidfd(_ fd: Int32) -> Int32? {
    let soPeerPidfd: Int32 = 77  // <asm-generic/socket.h>; not in older headers
    var pidfd: Int32 = -1
    var length = socklen_t(MemoryLayout<Int32>.size)
    guard getsockopt(fd, SOL_SOCKET, soPeerPidfd, &pidfd, &length) == 0, pidfd >= 0 else { return nil }
    return pidfd
  }

  /// SO_PEERSEC: the peer's LSM label (AppArmor's for snaps), as the bus daemon would report it.
  public static func peerLabel(_ fd: Int32) -> String? {
    var buffer = [UInt8](repeating: 0, count: 1024)
    var length = socklen_t(buffer.count)
    guard getsockopt(fd, SOL_SOCKET, SO_PEERSEC, &buffer, &length) == 0, length > 0 else { return nil }
    let bytes = buffer[0..<Int(length)].prefix { $0 != 0 }
    return bytes.isEmpty ? nil : String(decoding: bytes, as: UTF8.self)
  }

  /// Fills a sockaddr_un for `path`; nil when the path does not fit.
  static func address(_ path: String) -> sockaddr_un? {
    var address = sockaddr_un()
    address.sun_family = sa_family_t(AF_UNIX)
    let bytes = Array(path.utf8)
    let capacity = MemoryLayout.size(ofValue: address.sun_path)
    guard !bytes.isEmpty, bytes.count < capacity else { return nil }
    withUnsafeMutableBytes(of: &address.sun_path) { raw in
      raw.copyBytes(from: bytes)
      raw[bytes.count] = 0
    }
    return address
  }

  /// Connects to `path` (blocking, close-on-exec); returns the descriptor.
  public static func connect(_ path: String) throws(SystemCallError) -> Int32 {
    guard var address = address(path) else { throw SystemCallError("connect(\(path))", .fileNameTooLong) }
    let fd = try Syscall.check("socket(AF_UNIX)") {
      socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    }
    do {
      try Syscall.check("connect(\(path))") {
        withUnsafePointer(to: &address) {
          $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
          }
        }
      }
    } catch {
      close(fd)
      throw error
    }
    return fd
  }

  /// Whether a process listens on the socket at `path`, asked without blocking (the bus thread
  /// asks when it opens a forward): a listener whose backlog is full is busy, not gone, and is
  /// answered at once with EAGAIN; only ECONNREFUSED (nobody listens) makes the file stale.
  static func isAnswered(_ path: String) -> Bool {
    guard var address = address(path) else { return false }
    let fd = socket(
      AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
    guard fd >= 0 else { return false }
    defer { close(fd) }
    let r = withUnsafePointer(to: &address) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
        Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
      }
    }
    return r == 0 || errno == EAGAIN || errno == EINPROGRESS
  }

  /// A socket to listen on, and how it came.
  public struct Listener: Sendable {
    public let fd: Int32
    public let path: String
    /// Passed by systemd (tessera.socket) rather than made here.
    public let fromSystemd: Bool
    /// The socket file made here (device, inode): removed at the end only while it is still this one.
    var file: (dev: UInt64, ino: UInt64)? = nil
    /// The descriptor holding PATH.lock (tesserad's own socket): open for as long as the process lives.
    var lock: Int32 = -1

    /// Removes the socket file made here, unless another has taken its place since (a socket
    /// systemd made for the next start, another tesserad's): never one this process did not make.
    public func removeFile() {
      guard !fromSystemd, let file else { return }
      var st = stat()
      guard lstat(path, &st) == 0, UInt64(st.st_dev) == file.dev, UInt64(st.st_ino) == file.ino else { return }
      unlink(path)
    }
  }

  /// Why tesserad cannot serve the socket.
  public struct ListenError: Error, CustomStringConvertible, Sendable {
    public let description: String
    /// Another tesserad already serves it.
    public let alreadyServed: Bool

    /// A failure that is not another tesserad's serving.
    static func failed(_ text: String) -> ListenError { ListenError(description: text, alreadyServed: false) }
  }

  /// The socket systemd passed (tessera.socket, `sd_listen_fds`), when it is a listening Unix
  /// stream socket; else nil. The LISTEN_* variables are consumed either way.
  public static func fromSystemd() -> Listener? {
    let count = sd_listen_fds(1)
    guard count >= 1 else { return nil }
    let fd = SD_LISTEN_FDS_START
    // Any further descriptors are not ours to keep.
    for extra in (fd + 1)..<(fd + count) { close(extra) }
    guard sd_is_socket_unix(fd, Int32(SOCK_STREAM.rawValue), 1, nil, 0) > 0 else { return nil }
    var address = sockaddr_un()
    var length = socklen_t(MemoryLayout<sockaddr_un>.size)
    let named = withUnsafeMutablePointer(to: &address) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
    }
    var path = ""
    if named == 0 {
      path = withUnsafeBytes(of: &address.sun_path) { raw in
        String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
      }
    }
    _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
    _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
    return Listener(fd: fd, path: path, fromSystemd: true)
  }

  /// What a socket is listened on for: tesserad's own (its messages speak of another tesserad and
  /// TESSERA_SOCKET), or a forward's (`tessera forward`), in tesserad's own directory, which it
  /// makes, or in one the user chose, which must exist already.
  public enum Purpose: Sendable, Equatable {
    case broker
    case forward(makeDirectory: Bool)
  }

  /// Creates the directory (0700, unless it is a forward's in a directory the user chose, which
  /// must exist) and the socket (0600) at `path` and listens on it. The directory must be the
  /// user's and not writable by others; one that was there already is refused otherwise, never
  /// changed. A socket file nobody answers on (left by a killed tesserad) is replaced; one a live
  /// process answers on is not: another tesserad serves it.
  public static func listen(at path: String, purpose: Purpose = .broker) throws(ListenError) -> Listener {
    let elsewhere = purpose == .broker ? "set TESSERA_SOCKET to another path" : "choose another path"
    guard path.hasPrefix("/"), let address = address(path) else {
      throw .failed(
        "The socket path \(path) is not absolute or too long for a Unix socket (\(MemoryLayout<sockaddr_un>.size - 3) bytes at most); \(elsewhere)."
      )
    }
    try prepareDirectory(directory(of: path), purpose: purpose, elsewhere: elsewhere)
    // tesserad's own socket: a lock held for as long as the process lives decides which of two
    // tesserads starting at once makes it (a socket file nobody answers on is then surely stale:
    // no other tesserad can be between its bind and its listen).
    let lock = try purpose == .broker ? takeLock(path) : -1
    // On any failure from here, the lock goes with the attempt.
    var listening = false
    defer { if !listening && lock >= 0 { close(lock) } }
    try removeStale(path, purpose: purpose, elsewhere: elsewhere)
    let fd = try bindAndListen(path, address, purpose: purpose, elsewhere: elsewhere)
    var made = stat()
    let file = lstat(path, &made) == 0 ? (dev: UInt64(made.st_dev), ino: UInt64(made.st_ino)) : nil
    // The lock stays held (its descriptor open, close-on-exec) until the process ends.
    listening = true
    return Listener(fd: fd, path: path, fromSystemd: false, file: file, lock: lock)
  }

  /// The socket's directory, made where tesserad makes it, and checked: a directory, the user's,
  /// writable by no one else (one that was there already is refused, never changed).
  static func prepareDirectory(_ dir: String, purpose: Purpose, elsewhere: String) throws(ListenError) {
    var st = stat()
    if case .forward(makeDirectory: false) = purpose {
      guard lstat(dir, &st) == 0, st.st_mode & S_IFMT == S_IFDIR else {
        throw .failed("\(dir) is not a directory. Make it first (`mkdir -m 700 \(dir)`), or \(elsewhere).")
      }
    } else {
      // A forward's directory is inside tesserad's own (`…/tessera/forward`): both are made.
      if case .forward = purpose, mkdir(directory(of: dir), 0o700) != 0 && errno != EEXIST {
        throw .failed("Could not create \(directory(of: dir)): \(Errno(rawValue: errno)).")
      }
      if mkdir(dir, 0o700) != 0 && errno != EEXIST {
        throw .failed("Could not create \(dir): \(Errno(rawValue: errno)). Check that its parent exists and is yours.")
      }
      guard lstat(dir, &st) == 0, st.st_mode & S_IFMT == S_IFDIR else {
        throw .failed("\(dir) is not a directory. Remove it, or \(elsewhere).")
      }
    }
    guard st.st_uid == getuid() else {
      throw .failed(
        "\(dir) belongs to user \(st.st_uid), not to you: another user may have put it there. Remove it, or \(elsewhere) (a directory of yours)."
      )
    }
    // A directory that was there already is left as it is (it may be $HOME, named through
    // TESSERA_SOCKET): one others may write to is refused, with what to do.
    if st.st_mode & 0o022 != 0 {
      throw .failed(
        "Others may write to \(dir) (mode \(String(st.st_mode & 0o777, radix: 8))) and could replace the socket; run `chmod go-w \(dir)` or \(elsewhere)."
      )
    }
  }

  /// PATH.lock, held: the descriptor; refused when another tesserad holds it.
  static func takeLock(_ path: String) throws(ListenError) -> Int32 {
    let lock = open(path + ".lock", O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
    guard lock >= 0 else { throw .failed("Could not open \(path).lock: \(Errno(rawValue: errno)).") }
    guard flock(lock, LOCK_EX | LOCK_NB) != 0 else { return lock }
    let code = Errno(rawValue: errno)
    close(lock)
    guard code == .wouldBlock else { throw .failed("Could not lock \(path).lock: \(code).") }
    throw ListenError(
      description:
        "Another tesserad already serves \(path) (it holds \(path).lock). Stop it first (`systemctl --user stop tessera.socket tessera.service`, or end that tesserad).",
      alreadyServed: true)
  }

  /// A socket file at `path` that nobody answers on (left by a killed tesserad) is removed; one a
  /// live process answers on is refused, and anything else there too.
  static func removeStale(_ path: String, purpose: Purpose, elsewhere: String) throws(ListenError) {
    var st = stat()
    guard lstat(path, &st) == 0 else { return }
    guard st.st_mode & S_IFMT == S_IFSOCK else {
      throw .failed("\(path) exists and is not a socket. Remove it, or \(elsewhere).")
    }
    if isAnswered(path) {
      throw ListenError(
        description: purpose == .broker
          ? "Another tesserad already serves \(path) (a process answers on it). Stop it first (`systemctl --user stop tessera.socket tessera.service`, or end that tesserad)."
          : "A process already listens on \(path); \(elsewhere), or stop what listens there.",
        alreadyServed: true)
    }
    unlink(path)
  }

  /// A listening socket at `path` (0600), bound under a name of its own in the same directory and
  /// put in place once it listens (a hard link, which never replaces a file): another tesserad
  /// starting meanwhile never finds the socket there but not answering yet, which it would take
  /// for a stale one and remove. (A directory whose path leaves no room for the longer name gets
  /// the socket bound in place.)
  static func bindAndListen(_ path: String, _ address: sockaddr_un, purpose: Purpose, elsewhere: String)
    throws(ListenError) -> Int32
  {
    let takenMeanwhile = ListenError(
      description: purpose == .broker
        ? "Another tesserad took \(path) at the same moment. Only one may serve it."
        : "Something else took \(path) at the same moment; \(elsewhere).", alreadyServed: true)
    let fd = socket(
      AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
    guard fd >= 0 else { throw .failed("Could not create a socket: \(Errno(rawValue: errno))") }
    let dir = directory(of: path)
    let aside = dir + "/.tessera-\(String(UInt32.random(in: 0...UInt32.max), radix: 16))"
    let asideAddress = DirectSocket.address(aside)
    var bindAddress = asideAddress ?? address
    let bindPath = asideAddress == nil ? path : aside
    // Bound with no permission for others from the start (the chosen directory of a forward may
    // be searchable by others): the kernel gives the file the mode of the socket's inode, which
    // fchmod sets here, less the umask. Never through umask(2), which is the whole process's: a
    // directory another thread made in that instant got mode 0600 (issue 37). Then made 0600
    // exactly, under the name of its own, before it is linked into place.
    let bound =
      fchmod(fd, 0o600) == 0
      ? withUnsafePointer(to: &bindAddress) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
      } : -1
    if bound != 0 {
      let code = Errno(rawValue: errno)
      close(fd)
      if code == .addressInUse { throw takenMeanwhile }
      if purpose != .broker && (code == .readOnlyFileSystem || code == .permissionDenied) {
        throw .failed(
          "tesserad may not make a socket in \(dir) (\(code)): under its systemd unit (tessera.service) it may write only below $XDG_RUNTIME_DIR/tessera. Put the socket there."
        )
      }
      throw .failed("Could not bind \(path): \(code)")
    }
    _ = chmod(bindPath, 0o600)
    guard Glibc.listen(fd, 128) == 0 else {
      let code = Errno(rawValue: errno)
      close(fd)
      unlink(bindPath)
      throw .failed("Could not listen on \(path): \(code)")
    }
    guard bindPath != path else { return fd }
    let linked = link(bindPath, path)
    let linkErrno = errno
    unlink(bindPath)
    guard linked == 0 else {
      close(fd)
      if linkErrno == EEXIST { throw takenMeanwhile }
      throw .failed("Could not put the socket in place at \(path): \(Errno(rawValue: linkErrno))")
    }
    return fd
  }
}

/// The user's service manager, told how tesserad is doing (Type=notify); nothing without one.
public enum ServiceManager {
  public static func notify(_ state: String) { _ = sd_notify(0, state) }
}
