import Foundation
import Glibc
import SystemPackage
import Testing

@testable import TesseraSystem

/// The one of each file helper (issue 37 §13): `mkdir -p`, listing, the durable write.
@Suite struct FilesTests {
  func scratch() -> String {
    var template = Array("/tmp/tessera-files-XXXXXX".utf8CString)
    return template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
  }

  @Test func makeDirectoriesMakesWhatIsMissingPrivateAndSaysWhich() throws {
    let root = scratch()
    defer { _ = system("rm -rf '\(root)'") }
    let made = try Files.makeDirectories(root + "/a/b/c")
    #expect(made == [root + "/a", root + "/a/b", root + "/a/b/c"])
    var st = stat()
    #expect(stat(root + "/a/b", &st) == 0 && st.st_mode & 0o777 == 0o700)
    #expect(try Files.makeDirectories(root + "/a/b/c") == [], "nothing made twice")
    close(open(root + "/file", O_CREAT | O_WRONLY, 0o600))
    #expect {
      try Files.makeDirectories(root + "/file")
    } throws: { error in
      (error as? SystemCallError)?.errno == .notDirectory
    }
  }

  @Test func aDurableWriteReplacesTheFileWholeAndLeavesNoTemporaryFile() throws {
    let root = scratch()
    defer { _ = system("rm -rf '\(root)'") }
    let path = root + "/note"
    try Files.writeDurably(path, Array("one".utf8), temporary: path + ".tmp")
    try Files.writeDurably(path, Array("two".utf8), temporary: path + ".tmp")
    #expect(try Syscall.readFile(path, limit: 100) == Array("two".utf8))
    #expect(try Files.names(in: root) == ["note"], "no . or .., no temporary file")
    var st = stat()
    #expect(stat(path, &st) == 0 && st.st_mode & 0o777 == 0o600)
    // A temporary file of that name already there (another writer's) is never taken over.
    close(open(path + ".tmp", O_CREAT | O_WRONLY, 0o600))
    #expect {
      try Files.writeDurably(path, Array("three".utf8), temporary: path + ".tmp")
    } throws: { error in
      (error as? Files.WriteError)?.step == .create
    }
    #expect(try Syscall.readFile(path, limit: 100) == Array("two".utf8), "the old file stays whole")
    #expect(access(path + ".tmp", F_OK) == 0, "and the other writer's temporary file stays")
  }

  /// readAll reads into storage it never zeroes, and grows past 64 KiB: every byte comes back,
  /// whatever the size against its first buffer and against the limit.
  @Test(arguments: [0, 1, 4095, 65_535, 65_536, 65_537, 200_000])
  func readAllReturnsEveryByteAndRefusesOneOverTheLimit(size: Int) throws {
    let root = scratch()
    defer { _ = system("rm -rf '\(root)'") }
    let path = root + "/data"
    let bytes = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) }
    try Files.writeDurably(path, bytes, temporary: path + ".tmp")
    #expect(try Syscall.readFile(path, limit: size) == bytes, "exactly at the limit")
    #expect(try Syscall.readFile(path, limit: size + 100_000) == bytes, "well under it")
    if size > 0 {
      #expect {
        try Syscall.readFile(path, limit: size - 1)
      } throws: { error in
        (error as? SystemCallError)?.errno == .fileTooLarge
      }
    }
  }

  /// From a stream, in pieces smaller than a read asks for, it still reads to the end. (A socket
  /// pair made close-on-exec at once: a program another test starts meanwhile must not hold the
  /// writing end open.)
  @Test func readAllReadsAStreamWrittenInPiecesToItsEnd() throws {
    var ends: [Int32] = [-1, -1]
    try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &ends) == 0)
    let piece = [UInt8](repeating: 0x61, count: 1000)
    let writer = ends[1]
    Thread.detachNewThread {
      for _ in 0..<100 { _ = piece.withUnsafeBytes { write(writer, $0.baseAddress, $0.count) } }
      close(writer)
    }
    let read = try Syscall.readAll(FileDescriptor(rawValue: ends[0]), limit: 1 << 20)
    close(ends[0])
    #expect(read.count == 100_000)
    #expect(read.allSatisfy { $0 == 0x61 })
  }
}
