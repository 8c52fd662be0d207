import TesseraEngineFakes
import TesseraInterface
import XCTest

@testable import TesseraCore

func XCTAssertThrowsTessera(
  _ code: TesseraError.Code, _ body: () async throws -> Void, file: StaticString = #filePath, line: UInt = #line
) async {
  do {
    try await body()
    XCTFail("expected \(code.rawValue), got success", file: file, line: line)
  } catch let error as TesseraError {
    XCTAssertEqual(error.code, code, error.message, file: file, line: line)
    XCTAssertFalse(error.message.isEmpty, file: file, line: line)
  } catch {
    XCTFail("expected \(code.rawValue), got \(error)", file: file, line: line)
  }
}

extension SilentFastPath {
  /// Whether the bus thread answers this AcquireTokenSilent (its arguments) for `app` at `now`.
  func answer(_ arguments: [BusValue], now: Double, app: String?) -> PublishedReply<ReplyTemplate>? {
    guard case .dict(let options) = arguments[3],
      let request = try? RequestParser.tokenRequest(
        clientID: arguments[0].stringValue ?? "",
        scopes: { if case .strings(let s) = arguments[1] { s } else { [] } }(),
        accountID: arguments[2].stringValue ?? "", options: options)
    else { return nil }
    return serve(TesseraFront.Key(request), from: tessera, minValidity: request.minValidity, now: now, app: app)
  }
}
