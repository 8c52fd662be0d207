import Logging
import TesseraEngineFakes
import TesseraInterface
import XCTest

@testable import TesseraCore

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

/// Issue 37 §9: with the file store in use, what the user reads names the file store, never the
/// Secret Service or "the keyring".
final class StoreNamingTests: XCTestCase {
  /// Every message logged, with its level.
  final class CapturedLog: @unchecked Sendable {
    let lines = Locked<[String]>([])
    var logger: Logger {
      Logger(label: "test") { _ in Handler(lines: self.lines) }
    }
    struct Handler: LogHandler {
      let lines: Locked<[String]>
      var metadata: Logger.Metadata = [:]
      var logLevel: Logger.Level = .trace
      subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
      }
      func log(event: LogEvent) { lines.withLock { $0.append("\(event.message)") } }
    }
  }

  /// The fake keyring, reporting itself as the file store.
  final class FileKindStore: SecretStore, Sendable {
    let base = FakeStore()
    var storeDescription: StoreDescription {
      StoreDescription(kind: .file, path: "/home/ann/.local/state/tessera/store")
    }
    func loadAll() async throws -> [StoredItem] { try await base.loadAll() }
    func save(_ item: StoredItem) async throws { try await base.save(item) }
    func delete(matching attributes: [String: String]) async throws { try await base.delete(matching: attributes) }
    func probe(withinSeconds seconds: Double) async throws { try await base.probe(withinSeconds: seconds) }
  }

  func testTheNamesOfEachStore() {
    XCTAssertEqual(StoreKind.secretService.name(), "the Secret Service")
    XCTAssertEqual(StoreKind.file.name(path: "/s"), "the file store /s")
    XCTAssertEqual(StoreKind.memory.name(), "the memory store")
    XCTAssertEqual(StoreKind.name("file", path: "/s"), "the file store /s", "as GetStatus names it")
    XCTAssertEqual(StoreKind.name(nil), "the Secret Service", "an older broker's report")
    XCTAssertEqual(StoreKind.name("tpm"), "the store tpm", "a newer broker's store")
    XCTAssertEqual(
      "Using the \(StoreKind.secretService) store", "Using the secret-service store", "as config.toml writes it")
    XCTAssertEqual(StoreDescription(kind: .file, path: "/s").capitalizedName, "The file store /s")
  }

  func testAMoveNamesOnlyAStoreThatKeepsItems() throws {
    XCTAssertEqual(try StoreKind.movable(named: "file"), .file)
    XCTAssertEqual(try StoreKind.movable(named: "secret-service"), .secretService)
    for name in ["memory", "auto", "keyring", ""] {
      XCTAssertThrowsError(try StoreKind.movable(named: name)) { error in
        let e = error as? TesseraError
        XCTAssertEqual(e?.code, .invalidArgument)
        XCTAssertTrue(e?.message.contains("use one of: file, secret-service.") == true, e?.message ?? "")
      }
    }
  }

  func testAStoreChoiceReadsAsConfigTomlWritesIt() {
    XCTAssertEqual(BrokerConfig.StoreChoice(rawValue: "auto"), .auto)
    XCTAssertEqual(BrokerConfig.StoreChoice(rawValue: "secret-service"), .only(.secretService))
    XCTAssertNil(BrokerConfig.StoreChoice(rawValue: "secretService"))
    XCTAssertEqual(BrokerConfig.StoreChoice.only(.file).rawValue, "file")
    XCTAssertEqual(BrokerConfig.StoreChoice.names, ["auto", "secret-service", "file", "memory"])
  }

  func testAFileStoreThatFailsIsNamedInTheLogNotTheSecretService() async throws {
    let log = CapturedLog()
    let clock = FakeClock()
    let idp = await FakeIdP(clock: clock)
    let listeners = FakeListeners(answer: { state in ["code": "the-code", "state": state] })
    let store = FileKindStore()
    var config = BrokerConfig.fakeIdP
    config.accessMode = .open
    let broker = Broker(
      config: config,
      dependencies: BrokerDependencies(
        http: idp, store: store, browser: RecordingBrowser(listeners: listeners, idp: idp), listeners: listeners,
        events: RecordingEvents(), clock: clock),
      logger: log.logger)
    let request = try RequestParser.tokenRequest(clientID: "", scopes: [], accountID: "", options: [:])
    _ = try await broker.acquireTokenInteractive(request, caller: CallerInfo(busName: ":1.42"))
    await broker.finishStoreWrites()
    // The store stops answering; a refresh's writes wait in memory, and the next call says so.
    store.base.locked.withLock { $0 = true }
    let forced = try RequestParser.tokenRequest(
      clientID: "", scopes: [], accountID: "", options: ["force_refresh": .bool(true)])
    _ = try? await broker.acquireTokenSilent(forced)
    await broker.finishStoreWrites()
    _ = try? await broker.acquireTokenSilent(request)
    let retries = Task { await broker.runStoreRetries() }
    store.base.locked.withLock { $0 = false }
    // The retry loop's clock is the fake one: it runs as soon as it is scheduled.
    for _ in 0..<10_000 where !log.lines.withLock({ $0.contains { $0.contains("answers again") } }) {
      await Task.yield()
    }
    retries.cancel()
    let lines = log.lines.withLock { $0 }
    let named = lines.filter { $0.contains("unavailable") || $0.contains("answers again") }
    XCTAssertTrue(
      named.contains(
        "The file store /home/ann/.local/state/tessera/store is still unavailable; keeping changes in memory"),
      "\(lines)")
    XCTAssertTrue(
      named.contains(
        "The file store /home/ann/.local/state/tessera/store answers again: the changes kept in memory are stored now"),
      "\(lines)")
    XCTAssertFalse(lines.contains { $0.contains("Secret Service") || $0.contains("keyring") }, "\(lines)")
  }
}
