import TesseraCore
import TesseraInterface

/// The HTTP client in force, which a reload of the configuration replaces (ca_file,
/// ca_file_for_microsoft, allow_insecure_loopback): a request already sent finishes on the client
/// it started with; the next one takes the new client.
public final class ReloadableHTTPClient: HTTPClient, Sendable {
  private let current: Locked<CurlHTTPClient>

  public init(_ client: CurlHTTPClient) { current = Locked(client) }

  public var client: CurlHTTPClient { current.withLock { $0 } }

  public func replace(with client: CurlHTTPClient) { current.withLock { $0 = client } }

  public func send(_ request: HTTPRequest) async throws -> HTTPResponse { try await client.send(request) }

  /// See CurlHTTPClient.closeIdleConnections (blocks: a thread of its own).
  @discardableResult
  public func closeIdleConnections() -> Int { client.closeIdleConnections() }
}

/// The browser command in force (`browser`), which a reload replaces.
public final class ReloadableBrowserLauncher: BrowserLauncher, Sendable {
  private let current: Locked<CommandBrowserLauncher>

  public init(_ launcher: CommandBrowserLauncher) { current = Locked(launcher) }

  public func replace(with launcher: CommandBrowserLauncher) { current.withLock { $0 = launcher } }

  public func open(_ url: String) throws { try current.withLock { $0 }.open(url) }
}
