import TesseraInterface
import XCTest

/// The one error table and the one option table against what is written elsewhere: the contract
/// XML and docs/errors.md (tessera(1)'s EXIT STATUS: TesseraCLITests/ManPageTests.swift). A change
/// to a table without the documents (or the other way round) fails here.
final class ContractTests: XCTestCase {
  static let repo = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent()

  func read(_ path: String) throws -> String {
    try String(contentsOf: Self.repo.appendingPathComponent(path), encoding: .utf8)
  }

  /// Every `<annotation name="org.tessera.Broker1.Option.KEY" value="..."/>` of each method.
  func optionAnnotations(_ xml: String) -> [String: [String: String]] {
    var result: [String: [String: String]] = [:]
    for block in xml.split(separator: "<method name=\"").dropFirst() {
      let name = String(block.prefix { $0 != "\"" })
      let body = block
      guard let end = body.range(of: "</method>") else { continue }
      var options: [String: String] = [:]
      for line in body[..<end.lowerBound].split(separator: "\n") {
        guard let keyStart = line.range(of: "name=\"org.tessera.Broker1.Option."),
          let valueStart = line.range(of: "value=\"")
        else { continue }
        let key = line[keyStart.upperBound...].prefix { $0 != "\"" }
        let value = line[valueStart.upperBound...].prefix { $0 != "\"" }
        options[String(key)] = String(value)
      }
      result[name] = options
    }
    return result
  }

  func testTheContractAnnotatesExactlyTheOptionTable() throws {
    let annotated = optionAnnotations(try read("dbus/org.tessera.Broker1.xml"))
    for method in OptionMethod.allCases {
      let table = RequestOptions.options(for: method).mapValues(\.annotation)
      XCTAssertFalse(table.isEmpty, "\(method.rawValue) takes options")
      XCTAssertEqual(annotated[method.rawValue], table, "options of \(method.rawValue)")
    }
    // Methods without an a{sv} argument have none.
    XCTAssertEqual(annotated["Cancel"], [:])
  }

  func testOptionTableIsConsistent() {
    for option in RequestOptions.all {
      XCTAssertFalse(option.methods.isEmpty, option.key)
      switch option.kind {
      case .string: XCTAssertGreaterThan(option.maxBytes, 0, option.key)
      case .stringMap: XCTAssertGreaterThan(option.maxEntries, 0, option.key)
      case .uint32: XCTAssertNotNil(option.range, option.key)
      case .bool: break
      }
    }
    // A key means one thing whichever method takes it.
    XCTAssertEqual(Set(RequestOptions.all.map(\.key)).count, RequestOptions.all.count)
    XCTAssertTrue(RequestOptions.minValidity.range!.contains(RequestOptions.defaultMinValidity))
    XCTAssertTrue(RequestOptions.timeout.range!.contains(InteractiveTimeouts.browser))
    XCTAssertTrue(RequestOptions.timeout.range!.contains(InteractiveTimeouts.deviceCode))
  }

  func testValidationAppliesTheTable() {
    func refusal(_ options: [String: BusValue], _ method: OptionMethod = .acquireTokenSilent) -> String? {
      do {
        try RequestOptions.validate(options, for: method)
        return nil
      } catch {
        XCTAssertEqual(error.code, .invalidArgument)
        return error.message
      }
    }
    XCTAssertNil(refusal(["min_validity": .uint32(86_400), "force_refresh": .bool(true)]))
    XCTAssertNotNil(refusal(["min_validity": .uint32(86_401)]))
    XCTAssertNotNil(refusal(["min_validity": .int32(5)]))
    XCTAssertNotNil(refusal(["timeout": .uint32(0)]))
    XCTAssertNotNil(refusal(["prompt": .string("always")]))
    XCTAssertNotNil(refusal(["correlation_id": .string("has space")]))
    XCTAssertNotNil(refusal(["correlation_id": .string(String(repeating: "a", count: 129))]))
    XCTAssertNil(refusal(["correlation_id": .string(String(repeating: "a", count: 128))]))
    XCTAssertNotNil(
      refusal(["extra_query": .stringMap(Dictionary(uniqueKeysWithValues: (0..<33).map { ("k\($0)", "v") }))]))
    // The filter's keys are not the options' keys.
    XCTAssertNotNil(refusal(["force_refresh": .bool(true)], .getAccounts))
    XCTAssertNil(refusal(["username": .string("alice")], .getAccounts))
    XCTAssertNotNil(refusal(["username": .string("alice")], .acquireToken))
    // With several bad keys the message names the same one whatever the order.
    let message = refusal(["zzz": .bool(true), "aaa": .bool(true), "min_validity": .uint32(1)])
    XCTAssertTrue(message?.contains("'aaa'") ?? false, message ?? "")
  }

  // MARK: Errors

  func testEveryCodeHasADistinctNameAndExitStatus() {
    let codes = ErrorCode.allCases
    XCTAssertEqual(Set(codes.map(\.dbusName)).count, codes.count)
    let statuses = codes.map(\.exitCode) + ClientExitStatus.allCases.map(\.rawValue)
    XCTAssertEqual(Set(statuses).count, statuses.count, "one exit status, one meaning")
    for code in codes { XCTAssertEqual(ErrorCode(dbusName: code.dbusName), code) }
  }

  func testTheContractDocumentsExactlyTheErrorTable() throws {
    let xml = try read("dbus/org.tessera.Broker1.xml")
    var names = Set<String>()
    var rest = xml[...]
    while let range = rest.range(of: ErrorCode.dbusPrefix) {
      names.insert(ErrorCode.dbusPrefix + rest[range.upperBound...].prefix { $0.isLetter })
      rest = rest[range.upperBound...]
    }
    XCTAssertEqual(names, Set(ErrorCode.allCases.map(\.dbusName)))
  }

  /// docs/errors.md has one row per error (name and exit status) and per exit status of the CLI.
  func testErrorsDocumentHasTheTablesExitStatuses() throws {
    let document = try read("docs/errors.md")
    var rows: [String: Int32] = [:]
    var plain: Set<Int32> = []
    for line in document.split(separator: "\n") where line.hasPrefix("| ") {
      let cells = line.split(separator: "|").map { $0.trimmingCharacters(in: .whitespaces) }
      guard cells.count >= 2, let status = Int32(cells[1]) else { continue }
      if cells[0] == "—" {
        plain.insert(status)
      } else if cells[0].hasPrefix("`" + ErrorCode.dbusPrefix) {
        rows[cells[0].trimmingCharacters(in: CharacterSet(charactersIn: "`"))] = status
      }
    }
    XCTAssertEqual(rows, Dictionary(uniqueKeysWithValues: ErrorCode.allCases.map { ($0.dbusName, $0.exitCode) }))
    XCTAssertEqual(plain, Set(ClientExitStatus.allCases.map(\.rawValue)))
  }

  /// docs/errors.md's Microsoft column starts with the table's status for each error.
  func testErrorsDocumentHasTheMicrosoftStatuses() throws {
    var documented: [String: String] = [:]
    for line in try read("docs/errors.md").split(separator: "\n") where line.hasPrefix("| `" + ErrorCode.dbusPrefix) {
      let cells = line.split(separator: "|").map { $0.trimmingCharacters(in: .whitespaces) }
      documented[cells[0].trimmingCharacters(in: CharacterSet(charactersIn: "`"))] = cells[2]
    }
    for code in ErrorCode.allCases {
      let status = code.entry.microsoftStatus
      XCTAssertTrue(
        documented[code.dbusName]?.hasPrefix("\(status.rawValue) \(status.name)") == true,
        "\(code.rawValue): the doc says \(documented[code.dbusName] ?? "nothing"), the table \(status.rawValue) \(status.name)"
      )
    }
  }

  /// dbus/com.microsoft.identity.broker1.xml declares exactly the methods the daemon serves, each (sss) -> s.
  func testMicrosoftContractFileMatchesTheServedInterface() throws {
    let xml = try read("dbus/com.microsoft.identity.broker1.xml")
    XCTAssertTrue(xml.contains("<interface name=\"\(MicrosoftBrokerInterface.interfaceName)\">"))
    var declared: [String: [String]] = [:]
    for block in xml.split(separator: "<method name=\"").dropFirst() {
      let name = String(block.prefix { $0 != "\"" })
      let body = block[..<(block.range(of: "</method>")?.lowerBound ?? block.endIndex)]
      declared[name] = body.split(separator: "<arg ").dropFirst().map { arg in
        let type = arg.range(of: "type=\"").map { arg[$0.upperBound...].prefix { $0 != "\"" } } ?? ""
        let direction = arg.contains("direction=\"out\"") ? "out" : "in"
        return "\(direction):\(type)"
      }
    }
    let served = MicrosoftBrokerInterface.served
    XCTAssertEqual(Set(declared.keys), Set(served.methods.map(\.name)))
    for method in served.methods {
      XCTAssertEqual(declared[method.name], ["in:s", "in:s", "in:s", "out:s"], method.name)
      XCTAssertEqual(method.inputSignature, "sss")
      XCTAssertEqual(method.outputSignature, "s")
    }
    XCTAssertTrue(served.nameIsOptional, "another broker owning the name must not stop tesserad")
    XCTAssertEqual(served.callLimits.stringBytes, MicrosoftBrokerInterface.maxRequestBytes)
    // A refused call still gets the protocol's JSON error.
    let refused = served.refusal?("getAccounts", .invalidArgument("too long"))
    XCTAssertEqual(
      refused,
      [.string(#"{"error":{"context":"too long","diagnostics":null,"errorCode":0,"status":6,"subStatus":0,"tag":0}}"#)])
  }

  // MARK: Wire values

  func testAccountsAndTokensRoundTripThroughTheWire() {
    let account = AccountInfo(
      id: "a.b", username: "alice@example.test", name: "Alice", authority: "https://idp/t", environment: "idp",
      realm: "t", localAccountID: "sub")
    XCTAssertEqual(AccountInfo(busValue: account.busValue), account)
    XCTAssertEqual(account.busValue.count, 7)
    let token = TokenInfo(
      accessToken: "at", tokenType: "Bearer", expiresOn: 42, scopes: ["read"], account: account, idToken: nil,
      correlationID: "c")
    XCTAssertEqual(TokenInfo(busValue: token.busValue), token)
    XCTAssertNil(token.busValue["id_token"])
    XCTAssertNil(token.busValue["refresh_token"])
  }

  /// A newer broker's flow name still reaches the user: the URL and message are shown.
  func testInteractionWithAnUnknownFlowIsStillShown() {
    let browser = InteractionInfo(busValue: [
      "flow": .string("passkey"), "verification_uri": .string("https://idp/start"), "message": .string("Open it"),
    ])
    XCTAssertEqual(browser?.flow, .browser)
    XCTAssertEqual(browser?.verificationURI, "https://idp/start")
    XCTAssertEqual(browser?.message, "Open it")
    let device = InteractionInfo(busValue: ["verification_uri": .string("https://idp/d"), "user_code": .string("AB")])
    XCTAssertEqual(device?.flow, .deviceCode)
    XCTAssertEqual(device?.userCode, "AB")
    XCTAssertNil(InteractionInfo(busValue: ["flow": .string("browser")]))
    let known = InteractionInfo(flow: .deviceCode, verificationURI: "u", userCode: "c", expiresIn: 5, message: "m")
    XCTAssertEqual(InteractionInfo(busValue: known.busValue), known)
  }

  /// The decoding limits never refuse a call the tables allow: they only cut off the absurd early.
  func testWireLimitsFitEveryValidCall() {
    let limits = WireLimits.calls
    XCTAssertGreaterThanOrEqual(limits.entries, RequestOptions.all.count)
    XCTAssertGreaterThanOrEqual(limits.entries, RequestOptions.all.map(\.maxEntries).max()!)
    XCTAssertGreaterThanOrEqual(limits.stringBytes, RequestOptions.all.map(\.maxBytes).max()!)
    XCTAssertGreaterThanOrEqual(limits.stringBytes, ArgumentLimits.accountIDBytes)
    XCTAssertGreaterThanOrEqual(limits.elements, ArgumentLimits.scopes)
    // The largest valid call: every option, every scope, every extra_query entry.
    let largest = 3 + 2 * RequestOptions.all.count + ArgumentLimits.scopes + 2 * RequestOptions.extraQuery.maxEntries
    XCTAssertGreaterThanOrEqual(limits.values, largest)
    XCTAssertFalse(limits.nestedVariants, "an option has exactly its documented type")
  }

  func testCorrelationIDsAreVersion4UUIDs() {
    var seen = Set<String>()
    for _ in 0..<1000 {
      let id = CorrelationID.new()
      XCTAssertEqual(id.count, 36)
      XCTAssertEqual(Array(id)[14], "4")
      XCTAssertTrue("89ab".contains(Array(id)[19]))
      XCTAssertTrue(id.allSatisfy { "0123456789abcdef-".contains($0) })
      seen.insert(id)
    }
    XCTAssertEqual(seen.count, 1000)
  }
}

final class RFC3339Tests: XCTestCase {
  func testDatesAcrossEraLeapYearAndTheFarFuture() {
    XCTAssertEqual(RFC3339.format(0), "1970-01-01T00:00:00Z")
    XCTAssertEqual(RFC3339.format(951_782_400), "2000-02-29T00:00:00Z")
    XCTAssertEqual(RFC3339.format(1_795_868_400), "2026-11-28T12:20:00Z")
    XCTAssertEqual(RFC3339.format(TokenExpiry.never), "9999-12-31T23:59:59Z")
    XCTAssertEqual(RFC3339.format(-1), "1969-12-31T23:59:59Z")
  }
}
