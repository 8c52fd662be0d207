import CSystemd
import Glibc
import Logging

/// swift-log to the systemd journal, with metadata as structured fields (`TESSERA_<KEY>`).
/// Callers never pass tokens as metadata or message text; this handler does not filter.
public struct JournalLogHandler: LogHandler {
  public var metadata: Logger.Metadata = [:]
  public var logLevel: Logger.Level
  let identifier: String

  public init(identifier: String, level: Logger.Level) {
    self.identifier = identifier
    self.logLevel = level
  }

  /// True when stderr is connected to the journal (systemd sets JOURNAL_STREAM for services).
  public static var isJournalStream: Bool { getenv("JOURNAL_STREAM") != nil }

  public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
    get { metadata[key] }
    set { metadata[key] = newValue }
  }

  static func priority(_ level: Logger.Level) -> Int {
    switch level {
    case .trace, .debug: 7
    case .info: 6
    case .notice: 5
    case .warning: 4
    case .error: 3
    case .critical: 2
    }
  }

  static func fieldName(_ key: String) -> String {
    "TESSERA_" + String(key.uppercased().map { $0.isLetter || $0.isNumber ? $0 : "_" })
  }

  public func log(event: LogEvent) {
    var fields = [
      "MESSAGE=\(event.message)", "PRIORITY=\(Self.priority(event.level))", "SYSLOG_IDENTIFIER=\(identifier)",
      "CODE_FILE=\(event.file)", "CODE_LINE=\(event.line)", "CODE_FUNC=\(event.function)",
    ]
    for (key, value) in metadata.merging(event.metadata ?? [:], uniquingKeysWith: { $1 }) {
      // The catalog id of an audit record stays the journal's own field (journalctl MESSAGE_ID=…).
      if key == "MESSAGE_ID" {
        fields.append("MESSAGE_ID=\(value)")
        continue
      }
      fields.append("\(Self.fieldName(key))=\(value)")
    }
    // Its own field: an "error" metadata key already makes TESSERA_ERROR.
    if let error = event.error { fields.append("TESSERA_LOGGED_ERROR=\(error)") }
    let pointers = fields.map { strdup($0)! }
    defer { pointers.forEach { free($0) } }
    var vectors = pointers.map { iovec(iov_base: UnsafeMutableRawPointer($0), iov_len: strlen($0)) }
    _ = sd_journal_sendv(&vectors, Int32(vectors.count))
    _ = pointers.count
  }
}
