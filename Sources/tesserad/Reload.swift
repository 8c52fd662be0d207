import Logging
import ServiceLifecycle
import TesseraCore
import TesseraInterface
import TesseraPlatform
import TesseraSystem
import UnixSignals

/// Reads the configuration again and puts it in force without a restart (issue 26): on SIGHUP,
/// which `systemctl --user reload tessera` sends (ExecReload= in tessera.service).
///
/// The files are read and checked whole first (ConfigFiles, as at start), and the new HTTP client
/// is made (ca_file must be readable): any problem refuses the reload, the configuration in force
/// stays, and `tessera status` says why. Then, in this order, the log level, the HTTP client, the
/// browser command and the engine's settings change; cached tokens, connections, sign-ins under
/// way and forwards (unless the policy now forbids them) are kept.
final class ConfigReloader: Sendable {
  let option: String?
  let environment: [String: String]
  /// The configuration tesserad started with: `store` and `microsoft_broker` stay as it chose.
  let started: EffectiveConfig
  let broker: Broker
  let http: ReloadableHTTPClient
  let browser: ReloadableBrowserLauncher
  let levels: LogLevelSwitch
  /// --log-level was given: it outranks the file's log_level, at a reload too.
  let levelFromCommandLine: Bool
  let logger: Logger

  init(
    option: String?, environment: [String: String], started: EffectiveConfig, broker: Broker,
    http: ReloadableHTTPClient, browser: ReloadableBrowserLauncher, levels: LogLevelSwitch, levelFromCommandLine: Bool,
    logger: Logger
  ) {
    self.option = option
    self.environment = environment
    self.started = started
    self.broker = broker
    self.http = http
    self.browser = browser
    self.levels = levels
    self.levelFromCommandLine = levelFromCommandLine
    self.logger = logger
  }

  /// The HTTP client for a configuration's trust settings.
  static func httpClient(for config: BrokerConfig) throws -> CurlHTTPClient {
    try CurlHTTPClient(
      caFile: config.caFile, caFileForMicrosoft: config.caFileForMicrosoft,
      allowInsecureLoopback: config.allowInsecureLoopback)
  }

  /// One reload. Blocking reads (the files, ca_file) are small and local.
  func reload() async {
    logger.info("Reading the configuration again (SIGHUP)")
    let effective: EffectiveConfig
    switch ConfigFiles.load(option: option, environment: environment) {
    case .loaded(let loaded): effective = loaded
    case .problems(let problems):
      await broker.refuseReload(problems.map(\.description))
      return
    }
    let client: CurlHTTPClient
    do {
      client = try Self.httpClient(for: effective.config)
    } catch {
      await broker.refuseReload(["\(error)"])
      return
    }
    if !levelFromCommandLine { levels.level = Logger.Level(rawValue: effective.config.logLevel) ?? .info }
    // The replaced client's idle connections close once no request holds it (CurlHTTPClient.deinit).
    http.replace(with: client)
    browser.replace(with: CommandBrowserLauncher(configured: effective.config.browser, environment: environment))
    await broker.reload(effective, started: started.config)
  }
}

/// Waits for SIGHUP and reloads, one reload at a time, until the daemon stops.
struct ReloadService: Service {
  let reloader: ConfigReloader
  /// Trapping SIGHUP since tesserad began (Tesserad.run).
  let signals: UnixSignalsSequence

  func run() async {
    await cancelWhenGracefulShutdown {
      for await _ in signals { await reloader.reload() }
    }
  }
}
