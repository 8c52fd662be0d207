import Glibc
import SystemPackage

/// The file helpers every part of Tessera uses: directories made, entries listed, files written
/// whole and durably, and files read only after the descriptor actually opened is checked. One of
/// each, so the stores, the journals, the socket and the configuration cannot drift apart.
public enum Files {
  /// The directory holding `path` ("." for a bare name, "/" for a file at the root).
  public static func directory(of path: String) -> String {
    guard let slash = path.lastIndex(of: "/") else { return "." }
    return slash == path.startIndex ? "/" : String(path[..<slash])
  }

  /// A directory entry's name.
  public static func name(of entry: UnsafeMutablePointer<dirent>) -> String {
    withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
  }

  /// The names in `directory` (not "." and ".."), in the order the file system gives them; at
  /// most `limit` of them.
  public static func names(in directory: String, limit: Int = .max) throws(SystemCallError) -> [String] {
    guard let dir = opendir(directory) else { throw SystemCallError("opendir(\(directory))", Errno(rawValue: errno)) }
    defer { closedir(dir) }
    var names: [String] = []
    while names.count < limit, let entry = readdir(dir) {
      let name = Self.name(of: entry)
      if name != "." && name != ".." { names.append(name) }
    }
    return names
  }

  /// `mkdir -p`: makes `path` and its missing parents with `mode`, and returns those it made,
  /// outermost first. Throws when `path` is not a directory at the end.
  @discardableResult
  public static func makeDirectories(_ path: String, mode: mode_t = 0o700) throws(SystemCallError) -> [String] {
    var partial = ""
    var made: [String] = []
    for part in path.split(separator: "/") {
      partial += "/" + part
      if mkdir(partial, mode) == 0 { made.append(partial) }
    }
    var info = stat()
    try Syscall.check("stat(\(path))") { stat(path, &info) }
    guard info.st_mode & S_IFMT == S_IFDIR else { throw SystemCallError("mkdir(\(path))", .notDirectory) }
    return made
  }

  /// fsync of a directory: the entries made, renamed or removed in it survive a power cut.
  public static func syncDirectory(_ path: String) throws(SystemCallError) {
    let fd = try Syscall.check("open(\(path))") { open(path.isEmpty ? "/" : path, O_RDONLY | O_DIRECTORY | O_CLOEXEC) }
    defer { close(fd) }
    try Syscall.check("fsync(\(path))") { fsync(fd) }
  }

  /// What failed in `writeDurably`, and how.
  public struct WriteError: Error, Sendable, CustomStringConvertible {
    public enum Step: Sendable { case create, write, replace, syncDirectory }
    public let step: Step
    public let errno: Errno
    public var description: String { "\(step): \(errno)" }
  }

  /// Makes the file `path` (0600, exclusively: never one that is there already, nor through a
  /// link) holding `bytes`, fsynced. Removed again when the write fails after it was made.
  public static func writeNew(_ path: String, _ bytes: [UInt8]) throws(WriteError) {
    let fd: FileDescriptor
    do {
      fd = try FileDescriptor.open(
        FilePath(path), .writeOnly, options: [.create, .exclusiveCreate, .closeOnExec, .noFollow],
        permissions: [.ownerReadWrite])
    } catch {
      // Not made here: another's, never removed.
      throw WriteError(step: .create, errno: error as? Errno ?? .ioError)
    }
    do {
      // Closed once, whatever happens (a second close could take a descriptor another thread
      // has just been given the same number).
      try fd.closeAfter {
        try Syscall.writeAll(fd, bytes)
        try Syscall.check("fsync") { fsync(fd.rawValue) }
      }
    } catch {
      _ = unlink(path)
      throw WriteError(step: .write, errno: (error as? SystemCallError)?.errno ?? error as? Errno ?? .ioError)
    }
  }

  /// Writes `bytes` to `path` whole or not at all: to `temporary` (a name of its own beside it,
  /// made by `writeNew`), renamed over `path`, and the directory fsynced. After a kill or a power
  /// cut the file is the old one or the new one; a leftover `temporary` is never taken for it.
  /// `temporary` is removed on a failure after it was made (never one that was there already:
  /// another writer's).
  public static func writeDurably(_ path: String, _ bytes: [UInt8], temporary: String) throws(WriteError) {
    try writeNew(temporary, bytes)
    guard rename(temporary, path) == 0 else {
      let code = Errno(rawValue: errno)
      _ = unlink(temporary)
      throw WriteError(step: .replace, errno: code)
    }
    do { try syncDirectory(directory(of: path)) } catch { throw WriteError(step: .syncDirectory, errno: error.errno) }
  }
}

/// A file read through the descriptor that was checked: opened once (non-blocking, so a FIFO
/// put in its place cannot hang the reader), then its type, owner and mode read with fstat, and
/// the directory of the file actually opened (symbolic links resolved) checked too. A check by
/// path after the read could look at another file than the one read: a link, or a file swapped
/// in between.
public enum CheckedFile {
  /// Who may own and change the file.
  public struct Rules: Sendable {
    /// root may own it too (the administrator's files).
    public var rootMayOwn: Bool
    /// Mode bits of the file that refuse it: 0o022 where others must not write it, 0o077 where
    /// they must not read it either.
    public var forbiddenModeBits: mode_t
    public init(rootMayOwn: Bool, forbiddenModeBits: mode_t) {
      self.rootMayOwn = rootMayOwn
      self.forbiddenModeBits = forbiddenModeBits
    }
    /// A configuration file: this user's or root's, writable by no one else.
    public static let configuration = Rules(rootMayOwn: true, forbiddenModeBits: mode_t(S_IWGRP | S_IWOTH))
    /// A secret: this user's alone, readable by no one else.
    public static let secret = Rules(rootMayOwn: false, forbiddenModeBits: 0o077)
    /// An administrator's client secret for the users of the machine (a desktop app's, which
    /// RFC 8252 §8.5 says protects nothing): root's or this user's, writable by no one else.
    public static let sharedSecret = configuration
  }

  /// Why a file was not read.
  public enum Problem: Error, Sendable, CustomStringConvertible {
    /// open or read failed (ENOENT when it is not there, EFBIG when over the limit).
    case system(Errno)
    /// A FIFO, a directory, a device or a socket where a file belongs.
    case notRegular(kind: String)
    /// The file belongs to another user.
    case owner(uid: UInt32)
    /// The file's mode has a forbidden bit.
    case mode(mode_t)
    /// The directory holding the file actually opened belongs to another user.
    case directoryOwner(path: String, uid: UInt32)
    /// Others may write to that directory (not sticky), and so replace the file.
    case directoryMode(path: String, mode: mode_t)

    public var description: String {
      switch self {
      case .system(let code): "cannot be read: \(code)"
      case .notRegular(let kind): "is \(kind), not a regular file"
      case .owner(let uid): "belongs to another user (uid \(uid))"
      case .mode(let mode):
        mode & 0o044 != 0 && mode & 0o022 == 0
          ? "can be read by other users (mode \(String(mode & 0o7777, radix: 8)))"
          : "is writable by other users (mode \(String(mode & 0o7777, radix: 8)))"
      case .directoryOwner(let path, let uid): "is in the directory \(path), which belongs to another user (uid \(uid))"
      case .directoryMode(let path, let mode):
        "is in the directory \(path), which is writable by other users (mode \(String(mode & 0o7777, radix: 8)))"
      }
    }

    /// The errno when opening or reading failed.
    public var errno: Errno? { if case .system(let code) = self { code } else { nil } }
  }

  /// Reads the file at `path` (at most `limit` bytes) once `rules` hold for the file opened and
  /// its directory.
  public static func read(_ path: String, limit: Int, rules: Rules) throws(Problem) -> [UInt8] {
    let fd = try open(path, rules: rules)
    defer { try? fd.close() }
    do { return try Syscall.readAll(fd, limit: limit) } catch { throw .system(error.errno) }
  }

  /// The checks of `read`, without reading: whether the file may be read when it is needed (a
  /// client secret that `tessera config check` vets, and tesserad alone reads).
  public static func inspect(_ path: String, rules: Rules) throws(Problem) {
    let fd = try open(path, rules: rules)
    try? fd.close()
  }

  /// The file opened (non-blocking, close-on-exec, never as a controlling terminal) and checked.
  static func open(_ path: String, rules: Rules) throws(Problem) -> FileDescriptor {
    let fd: FileDescriptor
    do {
      fd = try FileDescriptor.open(
        FilePath(path), .readOnly, options: [.closeOnExec, .nonBlocking, .init(rawValue: O_NOCTTY)])
    } catch { throw .system(error as? Errno ?? .ioError) }
    do { try check(fd, rules: rules) } catch {
      try? fd.close()
      throw error
    }
    return fd
  }

  /// The checks of `read`, on an open descriptor.
  public static func check(_ fd: FileDescriptor, rules: Rules) throws(Problem) {
    var info = stat()
    guard fstat(fd.rawValue, &info) == 0 else { throw .system(Errno(rawValue: errno)) }
    guard info.st_mode & S_IFMT == S_IFREG else { throw .notRegular(kind: kind(info.st_mode)) }
    let me = geteuid()
    guard info.st_uid == me || (rules.rootMayOwn && info.st_uid == 0) else { throw .owner(uid: info.st_uid) }
    guard info.st_mode & rules.forbiddenModeBits == 0 else { throw .mode(info.st_mode) }
    // The directory of the file opened, not of the path named: a link from a dotfiles
    // manager is fine when its target is safe, and a link into a directory others can write
    // is not.
    guard let opened = openedPath(fd) else { return }
    let directory = Files.directory(of: opened)
    var dirInfo = stat()
    guard stat(directory, &dirInfo) == 0 else { return }  // gone since: the file was read as checked
    guard dirInfo.st_uid == me || dirInfo.st_uid == 0 else {
      throw .directoryOwner(path: directory, uid: dirInfo.st_uid)
    }
    let sticky = dirInfo.st_mode & S_ISVTX != 0
    if dirInfo.st_mode & mode_t(S_IWGRP | S_IWOTH) != 0 && !sticky {
      throw .directoryMode(path: directory, mode: dirInfo.st_mode)
    }
  }

  /// The path of the file an open descriptor refers to, as the kernel resolved it; nil without
  /// /proc or for a file removed since.
  static func openedPath(_ fd: FileDescriptor) -> String? {
    var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
    let n = readlink("/proc/self/fd/\(fd.rawValue)", &buffer, buffer.count - 1)
    guard n > 0 else { return nil }
    let path = String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    return path.hasPrefix("/") && !path.hasSuffix(" (deleted)") ? path : nil
  }

  static func kind(_ mode: mode_t) -> String {
    switch mode & S_IFMT {
    case S_IFIFO: "a FIFO"
    case S_IFDIR: "a directory"
    case S_IFSOCK: "a socket"
    case S_IFCHR, S_IFBLK: "a device"
    case S_IFLNK: "a symbolic link"
    default: "a special file"
    }
  }
}
