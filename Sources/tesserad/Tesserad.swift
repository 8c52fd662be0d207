import ArgumentParser
import Logging
import ServiceLifecycle
import TesseraBus
import TesseraCore
import TesseraInterface
import TesseraPlatform
import TesseraSystem
import UnixSignals

#if canImport(Glibc)
  import Glibc
#endif

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

@main
struct Tesserad: AsyncParsableCommand {
  static let configuration = CommandConfiguration(
    commandName: "tesserad",
    abstract: "The Tessera authentication broker daemon.",
    discussion: """
      tesserad owns your OAuth 2.0 / OpenID Connect accounts and refresh tokens, keeps them in the \
      Secret Service (or, per config.toml's store, in sealed files of its own or in memory), and hands access tokens to local programs over the session bus as \
      org.tessera.Broker1. It normally starts by D-Bus activation or as the systemd user unit \
      tessera.service; run it by hand to debug.

      Configuration: $XDG_CONFIG_HOME/tessera/config.toml (see tessera-config(5)), or the file \
      named by --config or $TESSERA_CONFIG.
      """,
    version: BrokerInterface.version)

  @Option(name: .long, help: ArgumentHelp("Read the configuration from this file.", valueName: "path"))
  var config: String?

  @Option(
    name: .long,
    help: ArgumentHelp(
      "Override log_level: trace, debug, info, notice, warning, error or critical.", valueName: "level"))
  var logLevel: String?

  func validate() throws {
    if let logLevel, !BrokerConfig.logLevels.contains(logLevel) {
      throw ValidationError("--log-level must be one of \(BrokerConfig.logLevels.joined(separator: ", ")).")
    }
  }

  func run() async throws {
    ProcessMemory.limitArenas()
    ProcessLimits.raiseFileLimit()
    ProcessLimits.forbidCoreDumps()
    let environment = ProcessInfo.processInfo.environment
    // A SIGHUP (`systemctl --user reload`) is taken from here on, and waits for the reload service:
    // one that comes while the daemon starts is not lost, and never ends it.
    signal(SIGHUP, SIG_IGN)
    let hangups = await UnixSignalsSequence(trapping: .sighup)
    let path = ConfigLocation.path(option: config, environment: environment)
    let effective = try loadConfiguration(environment)
    let brokerConfig = effective.config
    let levels = LogLevelSwitch(Logger.Level(rawValue: logLevel ?? brokerConfig.logLevel) ?? .info)
    Self.bootstrapLogging(levels)
    let logger = Logger(label: "tesserad")

    let http: ReloadableHTTPClient
    do {
      http = ReloadableHTTPClient(try ConfigReloader.httpClient(for: brokerConfig))
    } catch {
      printError("tesserad: \(error)")
      throw ExitCode(78)
    }
    let listener = try Self.ownSocket(environment, logger: logger)
    let moveJournal = FileStoreMoveJournal.defaultPath(environment: environment).map(FileStoreMoveJournal.init(path:))
    let opener = DaemonStoreOpener(environment: environment, logger: logger)
    let store = try await Self.openStore(
      effective, environment, opener: opener, moveJournal: moveJournal, logger: logger)
    let requests = RequestRouter()
    // Microsoft's broker protocol is one more front of the same engine, unless config.toml turns it off.
    let fronts = [BrokerInterface.description] + (brokerConfig.microsoftBroker ? [MicrosoftBrokerInterface.served] : [])
    let server = Self.busServer(fronts, requests, listener: listener, logger: logger)
    // Started by a session bus itself (dbus-daemon sets this; systemd's activation does not): when
    // that bus is gone by the time tesserad connects, the session has ended, and tesserad with it.
    server.sessionBusRequired = environment["DBUS_STARTER_BUS_TYPE"] == "session"
    // Forwards' sockets go beside tesserad's own (`tessera/forward/`); a killed run's are removed.
    let forwardDirectory = listener.map { DirectSocket.directory(of: $0.path) + "/forward" }
    if let forwardDirectory { BusForwards.removeStale(in: forwardDirectory) }
    let forwards = BusForwards(server: server, directory: forwardDirectory, clock: SystemClock())
    let notifier = DesktopNotifier(server: server, logger: logger)
    let browser = ReloadableBrowserLauncher(
      CommandBrowserLauncher(configured: brokerConfig.browser, environment: environment))
    var dependencies = BrokerDependencies(
      http: http, store: store,
      browser: browser,
      listeners: LoopbackListenerFactory(), events: BrokerSignals(server: server, notifier: notifier),
      clock: SystemClock(),
      afterLoad: { ProcessMemory.releaseFreed() },
      prompter: PortalAccessPrompter(server: server, logger: logger, fallback: notifier),
      // The memory store writes nothing: no journal either (after a restart there is nothing to redo).
      journal: store is MemoryStore
        ? nil : FileRefreshJournal.defaultDirectory().map(FileRefreshJournal.init(directory:)),
      storeOpener: opener, moveJournal: moveJournal, forwards: forwards, secrets: FileClientSecrets())
    // The keys tokens are bound to (DPoP): in the TPM when the user may use it, else software.
    dependencies.proofKeys = MachineKeys.source(environment: environment)
    let broker = Broker(config: brokerConfig, dependencies: dependencies, logger: logger)
    await broker.noteConfiguration(effective)
    let reloader = ConfigReloader(
      option: config, environment: environment, started: effective, broker: broker, http: http, browser: browser,
      levels: levels, levelFromCommandLine: logLevel != nil, logger: logger)
    requests.install(
      server: server, handler: TesseraFront(broker: broker, logger: logger),
      microsoft: MicrosoftFront(broker: broker, logger: logger))

    try await Self.serve(
      broker: broker, server: server, http: http, notifier: notifier, reloader: reloader, hangups: hangups,
      configPath: path, microsoftNames: fronts.dropFirst().map(\.busName), listener: listener, logger: logger)
  }

  /// The administrator's files (/etc/tessera), then the user's: any problem in any of them is a
  /// reason not to start (exit 78, sysexits' EX_CONFIG), each on a line with its file and line.
  func loadConfiguration(_ environment: [String: String]) throws -> EffectiveConfig {
    switch ConfigFiles.load(option: config, environment: environment) {
    case .loaded(let loaded): return loaded
    case .problems(let problems):
      for problem in problems { printError("tesserad: bad configuration: \(problem)") }
      throw ExitCode(78)
    }
  }

  /// Logs go to the journal when tesserad's stderr is the journal's stream, else to stderr; each
  /// level switchable at a reload; no token ever reaches either (InertLogHandler).
  static func bootstrapLogging(_ levels: LogLevelSwitch) {
    LoggingSystem.bootstrap { label in
      if JournalLogHandler.isJournalStream {
        return InertLogHandler(
          SwitchedLogHandler(JournalLogHandler(identifier: "tesserad", level: .trace), levels: levels))
      }
      return InertLogHandler(SwitchedLogHandler(StreamLogHandler.standardError(label: label), levels: levels))
    }
  }

  /// tesserad's own socket: the one systemd passes (tessera.socket), else made here. Another
  /// tesserad already serving it is a reason not to start; failing to make it is not (the bus
  /// still serves), unless there is no bus either (BusServer says so then).
  static func ownSocket(_ environment: [String: String], logger: Logger) throws -> DirectSocket.Listener? {
    if let passed = DirectSocket.fromSystemd() { return passed }
    guard let socketPath = DirectSocket.path(environment: environment) else { return nil }
    do {
      return try DirectSocket.listen(at: socketPath)
    } catch  where error.alreadyServed {
      printError("tesserad: \(error)")
      throw ExitCode(1)
    } catch {
      logger.warning("tesserad serves no socket of its own", metadata: ["reason": "\(error)"])
      return nil
    }
  }

  /// The store: the one an interrupted move leaves in use (finished first), else config.toml's
  /// choice; a choice that cannot be had is a reason not to start (exit 78).
  static func openStore(
    _ effective: EffectiveConfig, _ environment: [String: String], opener: DaemonStoreOpener,
    moveJournal: FileStoreMoveJournal?, logger: Logger
  ) async throws -> any SecretStore {
    if let finished = await StoreMove.finishInterrupted(
      moveJournal, opener: opener, configured: effective.config.store, policy: effective.policy,
      probeSeconds: autoProbeSeconds, logger: logger)
    {
      return finished
    }
    switch await chooseStore(
      effective.config.store, policy: effective.policy, environment: environment, logger: logger)
    {
    case .success(let chosen): return chosen
    case .failure(let problem):
      printError("tesserad: \(problem.message)")
      throw ExitCode(78)
    }
  }

  /// The bus server: the fronts on the session bus and tesserad's own socket, each call routed to
  /// its front, callers identified by CallerIdentity.
  static func busServer(
    _ fronts: [InterfaceDescription], _ requests: RequestRouter, listener: DirectSocket.Listener?, logger: Logger
  ) -> BusServer {
    BusServer(
      interfaces: fronts,
      log: { level, message in
        switch level {
        case .info: logger.info("\(message)")
        case .notice: logger.notice("\(message)")
        case .error: logger.error("\(message)")
        }
      },
      onCall: { call, token in requests.dispatch(call, token) },
      onCallerGone: { busName in requests.callerGone(busName) },
      answerAtOnce: { call in requests.answerAtOnce(call) },
      identify: { pid, label in CallerIdentity.pin(pid: pid, label: label) },
      identifyPinned: { pidfd, pid, label in CallerIdentity.pin(pidfd: pidfd, pid: pid, label: label) },
      listener: listener)
  }

  /// Runs the daemon's services until the bus goes away or SIGTERM/SIGINT, then leaves.
  static func serve(
    broker: Broker, server: BusServer, http: ReloadableHTTPClient, notifier: DesktopNotifier, reloader: ConfigReloader,
    hangups: UnixSignalsSequence, configPath path: String, microsoftNames: [String], listener: DirectSocket.Listener?,
    logger: Logger
  ) async throws {
    // After each maintenance pass, idle connections to identity providers are closed and freed
    // memory goes back to the system (both block: a thread of their own).
    let tidy: @Sendable () -> Void = {
      try? startThread(name: "tessera-tidy") {
        let closed = http.closeIdleConnections()
        ProcessMemory.releaseFreed()
        if closed > 0 {
          logger.debug("Closed idle connections to identity providers", metadata: ["count": "\(closed)"])
        }
      }
    }
    let bus = BusService(
      server: server, logger: logger, configPath: path, microsoftNames: microsoftNames,
      socketPath: listener.map { $0.fromSystemd ? "\($0.path) (from systemd)" : $0.path },
      started: { missing in await broker.noteSessionBus(missing: missing) })
    // Started in this order, stopped in reverse: the bus first, the keyring's queue last. The bus
    // going away ends the daemon, as a signal does.
    let services: [ServiceGroupConfiguration.ServiceConfiguration] = [
      .init(service: StoreService(broker: broker)),
      .init(service: MaintenanceService(broker: broker, afterEachPass: tidy)),
      .init(service: EventsService(broker: broker, server: server, notifier: notifier, logger: logger)),
      .init(service: ReloadService(reloader: reloader, signals: hangups)),
      .init(service: bus, successTerminationBehavior: .gracefullyShutdownGroup),
    ]
    let group = ServiceGroup(
      configuration: .init(services: services, gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
    var groupError: (any Error)?
    do { try await group.run() } catch { groupError = error }
    // The socket file made here goes with the daemon (systemd keeps its own for the next start).
    listener?.removeFile()
    // The bus service's own reason (name taken, no bus, bus gone) says more than the group's error.
    // The services have ended (the store's queued writes were awaited) and the bus is closed, but
    // an HTTP request may still run on its own thread (a refresh, a key fetch): exit(3) would run
    // OpenSSL's atexit clean-up under it and crash the daemon on its way out (a SIGSEGV in
    // libcrypto, seen in the test suite). Leave without running exit handlers, either way.
    var status: Int32 = 0
    if let failure = bus.failure.withLock({ $0 }) ?? groupError.map({ "\($0)" }) {
      printError("tesserad: \(failure)")
      status = 1
    }
    fflush(nil)
    _exit(status)
  }
}

/// The store config.toml's `store` names, resolved once at start. `auto`: the file store while it
/// holds records (so an account never ends up split across two stores), else the Secret Service
/// wherever the session bus has one (owned, or one it can start), whether or not it answers yet:
/// a keyring that is locked, slow or still starting keeps its accounts, and requests are told
/// why it cannot be used until it can. The file store only where there is no Secret Service.
func chooseStore(
  _ choice: BrokerConfig.StoreChoice, policy: ConfigPolicy = ConfigPolicy(), environment: [String: String],
  logger: Logger
) async -> Result<any SecretStore, TesseraError> {
  func fileStore() -> FileStore? {
    FileStore.defaultLocation(environment: environment).map {
      FileStore(directory: $0.directory, key: $0.key, logger: logger)
    }
  }
  let noHome = TesseraError(
    .configuration,
    "store = \"\(choice.rawValue)\" needs a place for the file store: set HOME (or XDG_STATE_HOME and XDG_CONFIG_HOME)."
  )
  func chosen(_ store: any SecretStore, _ why: String) -> Result<any SecretStore, TesseraError> {
    var metadata: Logger.Metadata = ["store": "\(store.storeDescription.kind)", "config": "\(choice.rawValue)"]
    if let path = store.storeDescription.path { metadata["directory"] = "\(path)" }
    if let key = store.storeDescription.key { metadata["key"] = "\(key)" }
    logger.notice("Using the \(store.storeDescription.kind) store: \(why)", metadata: metadata)
    return .success(store)
  }
  switch choice {
  case .only(.secretService): return chosen(SecretServiceStore(), "config.toml says so")
  case .only(.memory):
    return chosen(MemoryStore(), "config.toml says so; nothing is written, a restart needs a new sign-in")
  case .only(.file):
    guard let file = fileStore() else { return .failure(noHome) }
    return chosen(file, "config.toml says so")
  case .auto:
    // The administrator's allowed_stores narrow what `auto` chooses among.
    let fileAllowed = policy.allowedStores?.contains(.file) ?? true
    let keyringAllowed = policy.allowedStores?.contains(.secretService) ?? true
    if !fileAllowed && !keyringAllowed {
      return chosen(MemoryStore(), "the administrator's allowed_stores allow only it; a restart needs a new sign-in")
    }
    if !fileAllowed { return chosen(SecretServiceStore(), "the administrator's allowed_stores allow no file store") }
    if !keyringAllowed {
      guard let file = fileStore() else { return .failure(noHome) }
      return chosen(file, "the administrator's allowed_stores allow no Secret Service")
    }
    guard let file = fileStore() else {
      return chosen(SecretServiceStore(), "there is no place for a file store (no HOME)")
    }
    if await file.holdsRecords() {
      return chosen(file, "the file store holds records (store = \"auto\" keeps using it)")
    }
    let keyring = SecretServiceStore()
    switch await keyring.presence() {
    case .absent(let why):
      return chosen(file, "there is no Secret Service (\(why))")
    case .owned, .activatable:
      // Asked once, only to say in the log how it is: a keyring locked or still starting is
      // the user's store all the same (their accounts are in it), never replaced by the file store.
      do {
        try await keyring.probe(withinSeconds: autoProbeSeconds)
        return chosen(keyring, "it answers with its default collection unlocked")
      } catch {
        return chosen(
          keyring,
          "a Secret Service is on the session bus, though it cannot be used yet (\(firstSentence(TesseraError.wrap(error).message))); requests say why until it can"
        )
      }
    }
  }
}

/// Opens the store of a kind for a move (`tessera store migrate`) and for finishing one at start.
struct DaemonStoreOpener: StoreOpener {
  let environment: [String: String]
  let logger: Logger

  func open(_ kind: StoreKind) throws -> any SecretStore {
    switch kind {
    case .secretService: return SecretServiceStore()
    case .file:
      guard let location = FileStore.defaultLocation(environment: environment) else {
        throw TesseraError(
          .configuration, "The file store needs a place: set HOME (or XDG_STATE_HOME and XDG_CONFIG_HOME).")
      }
      return FileStore(directory: location.directory, key: location.key, logger: logger)
    case .memory: throw StoreKind.notMovable(kind.rawValue)
    }
  }
}

/// The first sentence of `text` (a period followed by a space or the end, outside parentheses):
/// what went wrong, without the advice that follows it, which is about waiting for the keyring.
func firstSentence(_ text: String) -> String {
  var depth = 0
  var index = text.startIndex
  while index < text.endIndex {
    switch text[index] {
    case "(": depth += 1
    case ")": depth = max(0, depth - 1)
    case "." where depth == 0:
      let next = text.index(after: index)
      if next == text.endIndex || text[next] == " " { return String(text[...index]) }
    default: break
    }
    index = text.index(after: index)
  }
  return text
}

/// How long `store = "auto"` waits for the Secret Service at start (only to log how it is: where one
/// is on the bus it is the store, answering or not).
let autoProbeSeconds = 1.5

func printError(_ message: String) {
  var stderr = StandardError()
  print(message, to: &stderr)
}

struct StandardError: TextOutputStream {
  mutating func write(_ string: String) {
    let bytes = Array(string.utf8)
    _ = bytes.withUnsafeBytes { Glibc.write(2, $0.baseAddress, $0.count) }
  }
}
