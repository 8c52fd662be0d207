import Foundation
import Glibc
import TesseraInterface
import XCTest

@testable import TesseraCore
@testable import TesseraPlatform

/// One store schema (issue 37 §12): every item kind is written by TokenCache.item(_:) and read back
/// by TokenCache.record(_:) alone, and a store move rebuilds each item exactly as the cache writes
/// it, from what a store's load returns. The file store names a record by a keyed hash of its
/// attributes: an item rebuilt with other attributes would be a second record at each move.
final class StoreSchemaTests: XCTestCase {
  static let account = Account(
    id: "acct-1", username: "alice@idp.test", name: "Alice", authority: "https://idp.test/t", environment: "idp.test",
    realm: "t", localAccountID: "sub-1")

  /// One record of every kind, and the variants whose attributes differ (a scope-bound refresh
  /// token, a family's).
  static var everyKind: [TokenCache.Record] {
    [
      .account(account),
      .refreshToken(
        RefreshTokenRecord(
          accountID: "acct-1", environment: "idp.test", clientID: "app1", authority: "https://idp.test/t",
          secret: "rt-1")
      ),
      .refreshToken(
        RefreshTokenRecord(
          accountID: "acct-1", environment: "idp.test", clientID: "app1", authority: "https://idp.test/t",
          secret: "rt-2", scopes: ["mail.read", "openid"])),
      .refreshToken(
        RefreshTokenRecord(
          accountID: "acct-1", environment: "idp.test", clientID: "app2", authority: "https://idp.test/t",
          secret: "rt-3", familyID: "1")),
      .accessToken(
        AccessTokenRecord(
          accountID: "acct-1", environment: "idp.test", realm: "t", clientID: "app1", scopes: ["read"], secret: "at-1",
          tokenType: "Bearer", expiresOn: 1_900_000_000, idToken: nil)),
      .appMetadata(AppMetadataRecord(environment: "idp.test", clientID: "app2", familyID: "1")),
      .grant(
        AccessGrant(app: "forward:build01@build01.example", clientID: "app1", accountID: "*", grantedAt: 7, via: "user")
      ),
      .use(AppUseRecord(app: "exe:/usr/bin/git", accountID: "acct-1", firstUsedAt: 8)),
      .current(CurrentAccountRecord(accountID: "acct-1"), environment: "idp.test"),
      .choice(
        AccountChoiceRecord(
          app: "flatpak:org.example.Mail", authority: "https://idp.test/t", accountID: "acct-1", chosenAt: 9)
      ),
      .proofKey(proofKey),
      .refreshToken(
        RefreshTokenRecord(
          accountID: "acct-1", environment: "idp.test", clientID: "app3", authority: "https://idp.test/t",
          secret: "rt-4", proofKey: proofKey.thumbprint)),
    ]
  }

  /// A DPoP key (software: its scalar is the blob) and what binds to it.
  static var proofKey: ProofKeyRecord {
    ProofKeyRecord(
      accountID: "acct-1", kind: .software,
      jwk: try! ProofJWK(point: [4] + Array(repeating: 1, count: 32) + Array(repeating: 2, count: 32)),
      blob: "c2NhbGFy", createdAt: 10)
  }

  func testEveryKindIsRebuiltAsTheCacheWritesItFromWhatTheSecretServiceReturns() {
    let written = Self.everyKind.map(TokenCache.item)
    // libsecret refuses an item with an attribute its schema does not name (the account chooser's
    // kept choice and a DPoP key were once refused by the Secret Service for "authority", "jkt").
    for item in written {
      XCTAssertEqual(
        Set(item.attributes.keys).subtracting(SecretServiceStore.attributeNames), [], "\(item.label): not in the schema"
      )
    }
    XCTAssertEqual(Set(written.compactMap { $0.attributes["kind"] }).count, TokenCache.itemKinds.count, "every kind")
    // The Secret Service's load returns each item's schema version and kind, and its secret.
    let loaded = written.map {
      StoredItem(
        attributes: ["tessera_schema": $0.attributes["tessera_schema"]!, "kind": $0.attributes["kind"]!],
        secret: $0.secret, label: "")
    }
    let rebuilt = TokenCache.movable(loaded)
    XCTAssertEqual(rebuilt.count, written.count)
    for (item, again) in zip(written, rebuilt) {
      XCTAssertEqual(again.attributes, item.attributes, item.label)
      XCTAssertEqual(again.label, item.label)
      XCTAssertEqual(again.secret, item.secret)
    }
    // And the cache reads back what it wrote.
    let (cache, skipped) = TokenCache.load(written)
    XCTAssertEqual(skipped, 0)
    XCTAssertEqual(cache.refreshTokens.count, 4)
    XCTAssertEqual(cache.proofKeys[Self.proofKey.thumbprint], Self.proofKey)
    XCTAssertEqual(cache.refreshTokens.last?.proofKey, Self.proofKey.thumbprint)
    XCTAssertEqual(cache.grants.count, 1)
    XCTAssertTrue(cache.hasUsed(app: "exe:/usr/bin/git", accountID: "acct-1"))
    XCTAssertEqual(cache.current(among: [Self.account])?.id, "acct-1")
  }

  /// Every kind moved from a file store to a store that returns only schema and kind (as the
  /// Secret Service's load does), and back into another file store: the same records, none
  /// doubled, none lost.
  func testEveryKindMovesAcrossTheStoresAndBackUnchanged() async throws {
    var template = Array("/tmp/tessera-schema-XXXXXX".utf8CString)
    let root = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
    defer { _ = try? FileManager.default.removeItem(atPath: root) }
    let key = FileStore.KeySource.file(root + "/store.key")
    let first = FileStore(directory: root + "/first", key: key)
    let written = Self.everyKind.map(TokenCache.item)
    try await first.apply(written.map { .save($0) })
    let names = { (dir: String) in Set(try FileManager.default.contentsOfDirectory(atPath: dir)) }
    let firstNames = try names(root + "/first")
    let keyring = KindOnlyStore()
    let journal = FileStoreMoveJournal(path: root + "/moving")
    let across = try await StoreMove.run(journal, from: first, to: keyring, fromKind: .file, toKind: .secretService)
    XCTAssertEqual(across, written.count)
    let second = FileStore(directory: root + "/second", key: key)
    let back = try await StoreMove.run(journal, from: keyring, to: second, fromKind: .secretService, toKind: .file)
    XCTAssertEqual(back, written.count)
    let arrived = try await second.loadAll()
    func identity(_ items: [StoredItem]) -> Set<[String: String]> {
      Set(items.map { $0.attributes.merging(["label": $0.label, "secret": $0.secret]) { a, _ in a } })
    }
    XCTAssertEqual(identity(arrived), identity(written))
    // The file store's records have the same names in both: the attributes hash alike.
    XCTAssertEqual(try names(root + "/second"), firstNames)
    let left = try await first.loadAll()
    XCTAssertEqual(left.count, 0, "moved, not copied")
  }

  /// A store that keeps whole items but returns, as the Secret Service's load does, only their
  /// schema version and kind beside the secret.
  final class KindOnlyStore: SecretStore, @unchecked Sendable {
    let memory = MemoryStore()
    var storeDescription: StoreDescription { .secretService }
    func loadAll() async throws -> [StoredItem] {
      try await memory.loadAll().map {
        StoredItem(
          attributes: ["tessera_schema": $0.attributes["tessera_schema"] ?? "", "kind": $0.attributes["kind"] ?? ""],
          secret: $0.secret, label: "")
      }
    }
    func save(_ item: StoredItem) async throws { try await memory.save(item) }
    func delete(matching attributes: [String: String]) async throws { try await memory.delete(matching: attributes) }
    func probe(withinSeconds seconds: Double) async throws {}
  }
}
