import Foundation
import Glibc
import TesseraCore
import XCTest

@testable import TesseraPlatform

/// The store move journal as a file: whole or absent, 0600 in a 0700 directory, its phase kept.
final class StoreMoveJournalTests: XCTestCase {
  func testTheJournalIsWrittenWholeWithItsPhaseAndRemoved() throws {
    let root = NSTemporaryDirectory() + "tessera-moving-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
    defer { try? FileManager.default.removeItem(atPath: root) }
    let journal = FileStoreMoveJournal(path: root + "/state/tessera/moving")
    XCTAssertNil(journal.pending())
    try journal.write(StoreMoveNote(from: .secretService, to: .file))
    XCTAssertEqual(journal.pending(), StoreMoveNote(from: .secretService, to: .file, deleting: false))
    var info = stat()
    XCTAssertEqual(stat(journal.path, &info), 0)
    XCTAssertEqual(info.st_mode & 0o777, 0o600)
    XCTAssertEqual(stat(root + "/state/tessera", &info), 0)
    XCTAssertEqual(info.st_mode & 0o777, 0o700)
    try journal.write(StoreMoveNote(from: .secretService, to: .file, deleting: true))
    XCTAssertEqual(journal.pending(), StoreMoveNote(from: .secretService, to: .file, deleting: true))
    XCTAssertFalse(FileManager.default.fileExists(atPath: journal.path + ".tmp"))
    try journal.end()
    XCTAssertNil(journal.pending())
    try journal.end()  // gone already: fine

    // A note that names no known store is no move (nothing to finish).
    try journal.write(StoreMoveNote(from: .file, to: .file))
    XCTAssertNil(journal.pending())
    XCTAssertEqual(
      FileStoreMoveJournal.defaultPath(environment: ["HOME": "/home/u"]), "/home/u/.local/state/tessera/moving")
    XCTAssertEqual(
      FileStoreMoveJournal.defaultPath(environment: ["HOME": "/home/u", "XDG_STATE_HOME": "/s"]), "/s/tessera/moving")
  }
}
