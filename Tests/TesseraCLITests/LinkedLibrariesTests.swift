import Foundation
import Glibc
import Testing

/// What the built binaries load at start (issue 41): full Foundation brings ICU and its data, 7 MB
/// of tesserad's memory idle when it was linked by one `import Foundation`. FoundationEssentials
/// is what Tessera uses; nothing may bring the rest back unnoticed.
@Suite struct LinkedLibrariesTests {
  /// The NEEDED entries of `binary`, as readelf prints them.
  func needed(_ binary: String) throws -> [String] {
    let output = FileManager.default.temporaryDirectory.path + "/tessera-readelf-\(getpid())"
    defer { unlink(output) }
    let status = system("readelf -d '\(binary)' > '\(output)' 2>&1")
    #expect(status == 0, "readelf (binutils) could not read \(binary)")
    let text = try String(contentsOfFile: output, encoding: .utf8)
    return text.split(separator: "\n").compactMap { line in
      guard line.contains("(NEEDED)"), let open = line.firstIndex(of: "["), let close = line.lastIndex(of: "]")
      else { return nil }
      return String(line[line.index(after: open)..<close])
    }
  }

  @Test func tesseradLoadsFoundationEssentialsAloneNotFoundationOrICU() throws {
    let binary = (BinaryTests.binary as NSString).deletingLastPathComponent + "/tesserad"
    try #require(FileManager.default.isExecutableFile(atPath: binary), "build tesserad first: swift build")
    let libraries = try needed(binary)
    #expect(!libraries.isEmpty, "readelf listed nothing: \(binary)")
    for unwanted in ["libFoundation.so", "libFoundationInternationalization.so", "lib_FoundationICU.so"] {
      #expect(!libraries.contains(unwanted), "tesserad links \(unwanted): an `import Foundation` came back")
    }
    // The TLS stack stays out until the first HTTP request (CurlLibrary loads libcurl then).
    #expect(!libraries.contains { $0.hasPrefix("libcurl") })
  }
}
