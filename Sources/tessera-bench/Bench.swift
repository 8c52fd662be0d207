import ArgumentParser
import Foundation
import TesseraBus
import TesseraCore
import TesseraInterface
import TesseraPlatform
import TesseraSystem

#if canImport(Glibc)
  import Glibc
#endif

// Over 450 lines on purpose: one measurement per function, in the order BENCHMARKS.md prints them,
// so the report and the code that makes each figure read side by side. Not shipped.

/// `tessera-bench [measure] …` (the benchmark) and `tessera-bench soak …` (the fault suite's soak).
@main
struct BenchCommand: ParsableCommand {
  static let configuration = CommandConfiguration(
    commandName: "tessera-bench",
    abstract: "Measure tesserad (the default), or hold it under a long load (soak).",
    subcommands: [Bench.self, Soak.self, P2PFloor.self, ProofsCommand.self, ClientCalls.self],
    defaultSubcommand: Bench.self)
}

/// Tessera's benchmark: runs inside scripts/test-session (private bus, unlocked keyring, test IdP)
/// and measures a tesserad binary against the D-Bus floor. See BENCHMARKS.md for how to read it.
struct Bench: ParsableCommand {
  static let configuration = CommandConfiguration(
    commandName: "measure",
    abstract:
      "Measure tesserad: silent latency and throughput against the D-Bus floor, single-flight, refresh cost, memory, start-up.",
    discussion: "Run it through scripts/bench, which sets up the session bus, keyring and test IdP it needs.")

  @Option(help: "The tesserad binary to measure.") var tesserad: String
  @Option(help: "The tessera CLI binary to measure against busctl.") var tessera: String?
  @Option(help: "Runs of each command for the CLI measurement.") var cliRuns = 200
  @Option(help: "Interleaved latency rounds (each: floor calls, then broker calls).") var rounds = 20
  @Option(help: "Calls per latency round and side.") var callsPerRound = 250
  @Option(help: "Seconds per throughput phase.") var phaseSeconds = 1.0
  @Option(help: "Throughput phases per side and concurrency.") var phases = 3
  @Option(help: "Refresh-cost pairs (broker force_refresh, direct request).") var refreshes = 30
  @Option(help: "Silent calls for the memory-growth measurement.") var growthCalls = 100_000
  @Option(help: "Start-ups to time (each way).") var startups = 5
  @Option(
    help: "Cached load for the memory measurement: accounts × clients × scope sets (default 100x10x3; smoke 10x2x1).")
  var load: String?
  @Option(help: "Write the results as JSON to this file.") var json: String?
  @Option(help: "Write BENCHMARKS.md (results, machine, how to read them) to this file.") var markdown: String?
  @Option(help: "The commit measured, for the report.") var commit = "unknown"
  @Option(
    help: "Tessera Accounts (Desktop/) to measure under Xvfb against the loaded cache: start to first frame, idle RSS.")
  var accountsApp: String?
  @Option(
    help:
      "The start-up floor: a Swift program linked as tessera is (runtime in, libsystemd loaded) that prints one line.")
  var swiftFloor: String?
  @Option(
    help:
      "scripts/lib/valgrind-sigsuspend.c built as a shared library: lets valgrind 3.19 run tesserad for the instruction counts."
  )
  var valgrindPreload: String?
  @Flag(help: "One quick round of everything (CI's check that the benchmark still runs).") var smoke = false
  @Option(help: "Also record perf profiles of the direct and bus paths into this directory (see Direct.swift).")
  var profile: String?
  @Option(help: "Calls per path for --profile.") var profileCalls = 20_000

  mutating func run() throws {
    if smoke {
      rounds = 2
      callsPerRound = 50
      phaseSeconds = 0.2
      phases = 1
      refreshes = 3
      growthCalls = 2000
      startups = 1
      cliRuns = 5
      load = load ?? "10x2x1"
    }
    let env = try Environment()
    var report = Report(machine: Machine.describe(), tesserad: tesserad, smoke: smoke)
    let daemon = Daemon(binary: tesserad, log: env.sessionDir + "/bench-tesserad.log")
    defer { daemon.stop() }

    // 5a. Memory, idle.
    try daemon.start()
    usleep(500_000)
    report.add(
      .init(
        id: "rss_idle", name: "RSS idle after start", value: daemon.rssMiB(), unit: "MiB", goal: 24, lowerIsBetter: true
      ))

    let client = try BusClient()
    let signedIn = try Broker.signIn(client, clientID: "tessera-test")
    log("signed in as \(signedIn)")
    // 5d. Memory that is tesserad's own, idle and signed in: its PSS (reported with the peer's).
    let pssSignedIn = daemon.pssMB()

    // 1. Silent latency against the floor and Ping, interleaved.
    let latency = try measureLatency(client)
    for (id, name, keyPath) in [
      ("p50", "median", \Stats.p50), ("p90", "p90", \Stats.p90), ("p99", "p99", \Stats.p99),
    ] {
      report.add(
        .init(
          id: "silent_\(id)", name: "Silent latency, \(name)", value: latency.broker[keyPath: keyPath], unit: "µs",
          detail: "Ping \(fmt(latency.ping[keyPath: keyPath])) µs, floor \(fmt(latency.floor[keyPath: keyPath])) µs"))
    }
    report.add(
      .init(
        id: "silent_ping_ratio", name: "Silent median / Ping median", value: latency.broker.p50 / latency.ping.p50,
        unit: "×", goal: 1.15, lowerIsBetter: true))
    report.add(
      .init(
        id: "microsoft_silent_p50", name: "Microsoft front: acquireTokenSilently from the cache, median",
        value: latency.microsoft.p50, unit: "µs",
        detail: "p99 \(fmt(latency.microsoft.p99)) µs; Ping \(fmt(latency.ping.p50)) µs on the same connection"))
    report.add(
      .init(
        id: "microsoft_silent_ping_ratio", name: "Microsoft acquireTokenSilently median / Ping median",
        value: latency.microsoft.p50 / latency.ping.p50, unit: "×", goal: 1.3, lowerIsBetter: true))
    report.add(
      .init(
        id: "silent_ratio", name: "Silent median / floor median", value: latency.broker.p50 / latency.floor.p50,
        unit: "×", detail: "Ping / floor \(fmt(latency.ping.p50 / latency.floor.p50)) ×"))

    // 1b. Per-app access control on (access_mode "confirm", the default) against off ("open", the
    // test session's): the same silent call from the app that signed in, whose decision the
    // daemon caches with its connection.
    let open = latency.broker.p50
    let guarded = try withAccessMode("confirm", daemon: daemon, env: env) { try measureLatency(client) }
    report.add(
      .init(
        id: "silent_p50_access_on", name: "Silent latency, median, access control on (confirm)",
        value: guarded.broker.p50, unit: "µs",
        detail: "off (open) \(fmt(open)) µs; Ping \(fmt(guarded.ping.p50)) µs in the same run"))
    report.add(
      .init(
        id: "silent_access_ratio", name: "Silent median: access control on / off",
        value: (guarded.broker.p50 / guarded.ping.p50) / (open / latency.ping.p50), unit: "×", goal: 1.05,
        lowerIsBetter: true, detail: "each against Ping in its own run"))

    // 1c. The same silent call over tesserad's own socket (peer-to-peer D-Bus, no bus daemon),
    // against a bare peer-to-peer sd-bus call with a reply of the same size (the floor for that
    // path, served by a child process) and against Ping on the bus, interleaved.
    let silent = BrokerCall.silent(clientID: "tessera-test")
    let socketPath = try Direct.socketPath()
    let direct = try Direct.connect(socketPath)
    let silentReply = try direct.call(member: silent.member, arguments: silent.arguments)
    let replyBytes = Marshalled.bodySize(silentReply)
    let floorServer = try FloorServer(replyBytes: replyBytes, parent: env.sessionDir)
    defer { floorServer.stop() }
    // The shape floor: the silent call's request and reply (values, types, nesting, bytes) between
    // a bare sd-bus server and this client, with no Tessera server code: what the contract alone
    // costs on this path.
    let shapeServer = try FloorServer(replyBytes: replyBytes, parent: env.sessionDir, shape: silentReply)
    defer { shapeServer.stop() }
    let busDaemon = try? client.call(
      destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
      member: "GetConnectionUnixProcessID", arguments: [.string("org.freedesktop.DBus")]
    ).first
    let busPID: [pid_t] = if case .uint32(let pid)? = busDaemon { [pid_t(pid)] } else { [] }
    let directLatency = try measureDirectLatency(
      direct: direct, floor: try floorServer.connect(), shape: try shapeServer.connect(), bus: client,
      servers: [[floorServer.pid], [daemon.pid], [daemon.pid] + busPID, [daemon.pid] + busPID, [shapeServer.pid]])
    for (id, name, keyPath) in [("p50", "median", \Stats.p50), ("p99", "p99", \Stats.p99)] {
      let value = directLatency.direct[keyPath: keyPath]
      let floor = directLatency.floor[keyPath: keyPath]
      let ping = directLatency.ping[keyPath: keyPath]
      report.add(
        .init(
          id: "direct_silent_\(id)", name: "Direct socket: silent latency, \(name)", value: value, unit: "µs",
          detail:
            "p2p floor \(fmt(floor)) µs (\(fmt(value / floor)) ×), Ping on the bus \(fmt(ping)) µs (\(fmt(value / ping)) ×); reply body \(replyBytes) bytes"
        ))
    }
    let cpu = directLatency.serverCPU
    let clientCPU = directLatency.clientCPU
    let ping = cpu[2].count > 1 ? ", dbus-daemon \(fmt(cpu[2][1])) µs" : ""
    let busSilent = cpu[3].count > 1 ? ", dbus-daemon \(fmt(cpu[3][1])) µs" : ""
    report.add(
      .init(
        id: "direct_cpu_per_call", name: "Direct socket: CPU per silent call, tesserad", value: cpu[1][0], unit: "µs",
        detail:
          "client \(fmt(clientCPU[1])) µs; p2p floor: server \(fmt(cpu[0][0])) µs, client \(fmt(clientCPU[0])) µs; Ping on the bus: tesserad \(fmt(cpu[2][0])) µs\(ping), client \(fmt(clientCPU[2])) µs; silent on the bus (median \(fmt(directLatency.busSilent.p50)) µs in these rounds): tesserad \(fmt(cpu[3][0])) µs\(busSilent), client \(fmt(clientCPU[3])) µs"
      ))
    report.add(
      .init(
        id: "direct_floor_ratio", name: "Direct silent median / p2p floor median",
        value: directLatency.direct.p50 / directLatency.floor.p50, unit: "×", goal: 1.3, lowerIsBetter: true))
    let shape = directLatency.shape
    report.add(
      .init(
        id: "direct_shape_floor_p50", name: "Direct socket: shape floor (the silent call's bytes and types), median",
        value: shape.p50, unit: "µs",
        detail:
          "\(fmt(shape.p50 / directLatency.floor.p50)) × the p2p floor; direct silent / shape floor \(fmt(directLatency.direct.p50 / shape.p50)) ×; CPU per call: server \(fmt(cpu[4][0])) µs, client \(fmt(clientCPU[4])) µs"
      ))
    // 1d. A new connection's first cached token (connect, authenticate, identify the caller,
    // answer, close): tesserad against the shape floor's server, and the system calls of each.
    let fresh = try measureNewConnections(daemonPID: daemon.pid, socketPath: socketPath, shape: shapeServer)
    report.add(
      .init(
        id: "new_connection_cpu", name: "Direct socket: tesserad CPU per new connection and its first cached token",
        value: fresh.tesserad, unit: "µs",
        detail:
          "shape floor server \(fmt(fresh.shape)) µs; client \(fmt(fresh.tesseradClient)) µs against \(fmt(fresh.shapeClient)) µs"
      ))
    report.add(
      .init(
        id: "new_connection_cpu_ratio", name: "New connection: tesserad / shape floor server, CPU",
        value: fresh.tesserad / fresh.shape, unit: "×", goal: 2.0, lowerIsBetter: true))
    switch (fresh.tesseradSyscalls, fresh.shapeSyscalls) {
    case (.success(let daemonCalls), .success(let floorCalls)):
      report.add(
        .init(
          id: "new_connection_syscalls", name: "Direct socket: tesserad's system calls per new connection",
          value: daemonCalls.map(\.count).reduce(0, +), unit: "calls",
          detail:
            "\(Strace.describe(daemonCalls)); shape floor server \(fmt(floorCalls.map(\.count).reduce(0, +))): \(Strace.describe(floorCalls))"
        ))
    case (.failure(let why), _), (_, .failure(let why)):
      log("system calls per new connection: not counted: \(why)")
    }
    if let profile {
      try recordProfiles(
        into: profile, count: profileCalls,
        [
          ("direct-silent", direct, silent), ("bus-silent", client, silent), ("bus-ping", client, .ping),
          ("p2p-floor", try floorServer.connect(), .p2pFloor),
        ])
    }
    report.add(
      .init(
        id: "direct_ping_ratio", name: "Direct silent median / Ping median (bus)",
        value: directLatency.direct.p50 / directLatency.ping.p50, unit: "×", goal: 0.8, lowerIsBetter: true))

    // 2. Throughput at 1, 4, 16 connections (and over the direct socket, in the same phases).
    for connections in [1, 4, 16] {
      let rates = try measureThroughput(
        connections: connections, directSocket: socketPath, floorSocket: floorServer.socket)
      report.add(
        .init(
          id: "throughput_\(connections)", name: "Throughput, \(connections) connection(s)", value: rates.broker,
          unit: "calls/s", detail: "Ping \(fmt(rates.ping)) calls/s, floor \(fmt(rates.floor)) calls/s"))
      report.add(
        .init(
          id: "throughput_ping_ratio_\(connections)", name: "Throughput / Ping, \(connections) connection(s)",
          value: rates.broker / rates.ping, unit: "×", goal: 0.85, lowerIsBetter: false,
          detail: "broker / floor \(fmt(rates.broker / rates.floor)) ×"))
      report.add(
        .init(
          id: "direct_throughput_\(connections)", name: "Direct socket: throughput, \(connections) connection(s)",
          value: rates.direct, unit: "calls/s",
          detail: "Ping on the bus \(fmt(rates.ping)) calls/s, p2p floor \(fmt(rates.p2pFloor)) calls/s"))
      report.add(
        .init(
          id: "direct_throughput_ping_ratio_\(connections)",
          name: "Direct throughput / Ping on the bus, \(connections) connection(s)", value: rates.direct / rates.ping,
          unit: "×", goal: connections == 1 ? 1.0 : 1.5, lowerIsBetter: false,
          detail: "direct / p2p floor \(fmt(rates.direct / rates.p2pFloor)) ×"))
    }
    floorServer.stop()

    // 2b. The CLI against busctl, same call.
    var peer: PeerTimes?
    if let tessera {
      let cli = try measureCLI(tessera: tessera)
      report.add(
        .init(
          id: "cli_token", name: "`tessera token`, median wall time", value: cli.tessera, unit: "ms",
          detail:
            "`busctl --user call` of the same AcquireTokenSilent \(fmt(cli.busctl)) ms; over the session bus (`tessera --bus token`)"
        ))
      report.add(
        .init(
          id: "cli_ratio", name: "`tessera token` / `busctl --user call`", value: cli.tessera / cli.busctl, unit: "×",
          goal: 1.2, lowerIsBetter: true))
      report.add(
        .init(
          id: "direct_cli_token", name: "`tessera token` over the direct socket, median wall time",
          value: cli.direct, unit: "ms",
          detail: "`busctl --user call` \(fmt(cli.busctl)) ms, `tessera --bus token` \(fmt(cli.tessera)) ms"))
      report.add(
        .init(
          id: "direct_cli_ratio", name: "`tessera token` (direct socket) / `busctl --user call`",
          value: cli.direct / cli.busctl, unit: "×", goal: 1.0, lowerIsBetter: true))
      report.add(
        .init(
          id: "cli_startup", name: "Start-up: `tessera --version`, median wall time", value: cli.version, unit: "ms",
          detail: "`busctl --version` \(fmt(cli.busctlVersion)) ms (\(fmt(cli.version / cli.busctlVersion)) ×)"))
      // 2c. The closest peer, oidc-agent, and the start-up floor (issue 41).
      peer = measurePeerOrSay(tessera: tessera, env: env)
      if let peer {
        report.add(
          .init(
            id: "peer_oidc_token", name: "`oidc-token` (oidc-agent), cached token, median wall time",
            value: peer.oidcToken.p50, unit: "ms",
            detail: "`tessera token` \(fmt(peer.tessera.p50)) ms in the same rounds (direct socket)"))
        report.add(
          .init(
            id: "peer_token_ratio", name: "`tessera token` / `oidc-token`, cached",
            value: peer.tessera.p50 / peer.oidcToken.p50,
            unit: "×", goal: 2.0, lowerIsBetter: true))
        if let floor = peer.floor {
          report.add(
            .init(
              id: "cli_startup_floor_ratio", name: "`tessera --version` / a static Swift program with libsystemd",
              value: peer.version.p50 / floor.p50, unit: "×", goal: 1.3, lowerIsBetter: true,
              detail: "\(fmt(peer.version.p50)) ms against \(fmt(floor.p50)) ms"))
        }
      }
      if case .failure(let why)? = peer?.agentInstructions {
        log("oidc-agent's instructions per request: not counted: \(why)")
      }
      if let peer {
        let agentCalls = (try? peer.agentSyscalls.get()).map { calls in
          "; system calls \(fmt(calls.map(\.count).reduce(0, +))): \(Strace.describe(calls))"
        }
        report.add(
          .init(
            id: "peer_agent_cpu", name: "oidc-agent: CPU per `oidc-token` request (a new connection each)",
            value: peer.agentCPU, unit: "µs",
            detail: "tesserad per new connection \(fmt(fresh.tesserad)) µs\(agentCalls ?? "")"))
      }
      for (name, path) in [("tessera", tessera), ("tesserad", tesserad)] {
        let binary = Binary.describe(path)
        report.add(
          .init(
            id: "size_\(name)", name: "`\(name)` binary size", value: binary.sizeMiB, unit: "MiB",
            detail: "links \(binary.libraries.count): \(binary.libraries.joined(separator: ", "))"))
      }
    }

    report.add(
      .init(
        id: "pss_signed_in", name: "tesserad PSS, idle and signed in", value: pssSignedIn.pss, unit: "MB", goal: 16,
        lowerIsBetter: true,
        detail: "anonymous \(fmt(pssSignedIn.anonymous)) MB"
          + (peer.map {
            "; oidc-agent holding its token \(fmt($0.agentPSS.pss)) MB, anonymous \(fmt($0.agentPSS.anonymous)) MB"
          } ?? "")))

    // 3. Single-flight on an expired token.
    let requests = try measureSingleFlight(env: env, client: client)
    report.add(
      .init(
        id: "single_flight", name: "Token requests for 64 concurrent silent calls on an expired token",
        value: Double(requests), unit: "requests", goal: 1, lowerIsBetter: true, exact: true))

    // 4. Refresh cost against a direct request.
    let refresh = try measureRefresh(env: env, client: client)
    report.add(
      .init(
        id: "refresh_broker", name: "force_refresh silent call, median", value: refresh.broker, unit: "ms",
        detail: "direct refresh \(fmt(refresh.direct)) ms"))
    report.add(
      .init(
        id: "refresh_ratio", name: "Refresh: broker / direct", value: refresh.broker / refresh.direct, unit: "×",
        goal: 1.2, lowerIsBetter: true))

    // 5c. Memory growth over many silent calls.
    let before = daemon.rssMiB()
    for _ in 0..<growthCalls { _ = try client.call(member: silent.member, arguments: silent.arguments) }
    let after = daemon.rssMiB()
    report.add(
      .init(
        id: "rss_growth", name: "RSS growth over \(growthCalls) silent calls", value: after - before, unit: "MiB",
        goal: 1, lowerIsBetter: true, strict: true))

    // 4b. What binding tokens to this machine costs (DPoP, issue 40); after 5c, which wants the
    // daemon this measurement restarts warm.
    let dpop = try measureDPoPRefresh(daemon: daemon, env: env)
    report.add(
      .init(
        id: "dpop_refresh", name: "Refresh bound to this machine's key (DPoP, \(dpop.keyKind) key), median",
        value: dpop.dpop.p50, unit: "ms",
        detail:
          "bearer refresh at the same glewlwyd \(fmt(dpop.plain.p50)) ms; p90 \(fmt(dpop.dpop.p90)) / \(fmt(dpop.plain.p90)) ms"
      ))
    report.add(
      .init(
        id: "dpop_refresh_ratio", name: "Refresh: DPoP / bearer, same server", value: dpop.dpop.p50 / dpop.plain.p50,
        unit: "×", goal: 1.3, lowerIsBetter: true))
    let proofs = try measureProofs(scratch: env.sessionDir)
    report.add(
      .init(
        id: "dpop_proof_software", name: "DPoP proof with a software key, median", value: proofs.software.p50,
        unit: "µs", goal: 200, lowerIsBetter: true, detail: "p99 \(fmt(proofs.software.p99)) µs"))
    switch proofs.tpm {
    case .success(let tpm):
      report.add(
        .init(
          id: "dpop_proof_tpm", name: "DPoP proof with a key in the TPM (swtpm), median", value: tpm.p50, unit: "µs",
          detail: "p99 \(fmt(tpm.p99)) µs; a hardware TPM is slower"))
    case .failure(let why):
      log("DPoP proof with a key in the TPM: not measured: \(why)")
    }

    // 3b. Instructions per call, counted by callgrind (CPU placement cannot move them): tesserad
    // and the client library, each against the shape floor's.
    do {
      let counts = try measureInstructions(daemon: daemon, env: env, silentReply: silentReply)
      report.add(
        .init(
          id: "instructions_silent", name: "Instructions per direct silent call, tesserad", value: counts.tesserad,
          unit: "instr.", detail: "shape floor server \(fmt(counts.shapeServer)) (callgrind, every thread)"))
      report.add(
        .init(
          id: "instructions_silent_ratio", name: "Instructions per direct silent call: tesserad / shape floor server",
          value: counts.tesserad / counts.shapeServer, unit: "×", goal: 1.5, lowerIsBetter: true))
      report.add(
        .init(
          id: "instructions_new_connection",
          name: "Instructions per new connection and its first cached token, tesserad",
          value: counts.tesseradConnection, unit: "instr.",
          detail:
            "shape floor server \(fmt(counts.shapeServerConnection)) (\(fmt(counts.tesseradConnection / counts.shapeServerConnection)) ×)"
            + ((try? peer?.agentInstructions.get()).map {
              "; oidc-agent per `oidc-token` (a new connection each) \(fmt($0))"
            } ?? "")
        ))
      report.add(
        .init(
          id: "instructions_client", name: "Instructions per silent call, client library (typed result)",
          value: counts.typedClient, unit: "instr.",
          detail: "shape floor client (the bus layer's call, bus values) \(fmt(counts.rawClient))"))
      report.add(
        .init(
          id: "instructions_client_ratio", name: "Instructions per silent call: client library / shape floor client",
          value: counts.typedClient / counts.rawClient, unit: "×", goal: 1.3, lowerIsBetter: true))
    } catch {
      log("instructions per call: not counted: \(error)")
    }

    // 6. Start-up from exec and through D-Bus activation, and the keyring's own time.
    daemon.stop()
    let keyring = try measureKeyringLoad()
    let exec = try measureStartup(daemon: daemon, activation: false)
    report.add(
      .init(
        id: "keyring_load", name: "Keyring: loading every Tessera item (reported apart)", value: keyring, unit: "ms"))
    report.add(
      .init(
        id: "startup_exec", name: "Start-up: exec to first silent token, minus keyring", value: exec - keyring,
        unit: "ms", goal: 50, lowerIsBetter: true, detail: "total \(fmt(exec)) ms"))
    if env.activationAvailable {
      daemon.stop()
      let activated = try measureStartup(daemon: daemon, activation: true)
      report.add(
        .init(
          id: "startup_activation", name: "Start-up: D-Bus activation to first silent token, minus keyring",
          value: activated - keyring, unit: "ms", goal: 50, lowerIsBetter: true, detail: "total \(fmt(activated)) ms"))
      daemon.adoptActivated()
    }

    // 5b. Memory with a loaded cache.
    daemon.stop()
    let parts = (load ?? "100x10x3").split(separator: "x").compactMap { Int($0) }
    guard parts.count == 3 else { throw ValidationError("--load is ACCOUNTSxCLIENTSxSCOPESETS, e.g. 100x10x3") }
    try populate(accounts: parts[0], clients: parts[1], scopeSets: parts[2], environment: env)
    try daemon.start()
    let loaded = try BusClient()
    let loadStart = monotonic()
    _ = try loaded.call(member: "GetAccounts", arguments: [.dict([:])], timeoutSeconds: 300)
    log("the daemon loaded its cache in \(fmt((monotonic() - loadStart) * 1000)) ms")
    usleep(300_000)
    report.add(
      .init(
        id: "rss_loaded", name: "RSS with \(parts[0]) accounts × \(parts[1]) clients × \(parts[2]) scope sets cached",
        value: daemon.rssMiB(), unit: "MiB", goal: 40, lowerIsBetter: true,
        detail: "anonymous \(fmt(daemon.anonymousMiB())) MiB"))
    // 7. The desktop app against that cache, under Xvfb with the cairo renderer (issue 39).
    if let accountsApp {
      let app = try measureAccountsApp(accountsApp, accounts: parts[0])
      report.add(
        .init(
          id: "app_first_frame", name: "Tessera Accounts: start to the first drawn window (cairo, GL off, Xvfb)",
          value: app.firstFrame, unit: "ms", goal: 300, lowerIsBetter: true,
          detail: "\(parts[0]) accounts drawn after \(fmt(app.accountsShown)) ms"))
      report.add(
        .init(
          id: "app_rss_idle", name: "Tessera Accounts: RSS idle with \(parts[0]) accounts", value: app.rss, unit: "MiB",
          goal: 64, lowerIsBetter: true))
    }
    daemon.stop()
    // The synthetic items are in the session's in-memory collection, gone with the session.

    print(report.table())
    if let json { try report.json().write(toFile: json, atomically: true, encoding: .utf8) }
    if let markdown { try report.markdown(commit: commit).write(toFile: markdown, atomically: true, encoding: .utf8) }
  }

  // MARK: Measurements

  func measureLatency(_ client: BusClient) throws -> (floor: Stats, ping: Stats, broker: Stats, microsoft: Stats) {
    let silent = BrokerCall.silent(clientID: "tessera-test")
    let calls = [
      BrokerCall.floor, BrokerCall.ping, silent, try BrokerCall.microsoftSilent(client, clientID: "tessera-test"),
    ]
    var samples: [[Double]] = [[], [], [], []]
    for _ in 0..<(smoke ? 10 : 200) {  // warm-up
      for call in calls {
        _ = try client.call(
          destination: call.destination, path: call.path, interface: call.interface, member: call.member,
          arguments: call.arguments)
      }
    }
    for _ in 0..<rounds {
      for (index, call) in calls.enumerated() { samples[index] += try timeCalls(client, call, count: callsPerRound) }
    }
    return (Stats(samples[0]), Stats(samples[1]), Stats(samples[2]), Stats(samples[3]))
  }

  func timeCalls(_ client: BusClient, _ call: BrokerCall, count: Int) throws -> [Double] {
    var samples: [Double] = []
    samples.reserveCapacity(count)
    for _ in 0..<count {
      let start = monotonic()
      _ = try client.call(
        destination: call.destination, path: call.path, interface: call.interface, member: call.member,
        arguments: call.arguments)
      samples.append((monotonic() - start) * 1e6)
    }
    return samples
  }

  /// Silent calls over the direct socket, the p2p floor, Ping and silent calls on the bus, and the
  /// shape floor, interleaved in rounds; with the CPU time each call costs the processes on its
  /// path (from the kernel's per-thread accounting): the servers (`servers`, per kind of call: the
  /// floor server; tesserad; tesserad and dbus-daemon, twice; the shape floor's server), and this
  /// client's thread.
  func measureDirectLatency(
    direct: BusClient, floor: BusClient, shape: BusClient, bus: BusClient, servers: [[pid_t]]
  ) throws -> (
    floor: Stats, direct: Stats, ping: Stats, busSilent: Stats, shape: Stats, serverCPU: [[Double]],
    clientCPU: [Double]
  ) {
    let silent = BrokerCall.silent(clientID: "tessera-test")
    let calls = [
      (floor, BrokerCall.p2pFloor), (direct, silent), (bus, .ping), (bus, silent), (shape, .shapeFloor(silent)),
    ]
    var samples: [[Double]] = calls.map { _ in [] }
    var serverCPU = servers.map { $0.map { _ in 0.0 } }
    var clientCPU = calls.map { _ in 0.0 }
    for _ in 0..<(smoke ? 10 : 200) {  // warm-up
      for (client, call) in calls { _ = try timeCalls(client, call, count: 1) }
    }
    for _ in 0..<rounds {
      for (index, (client, call)) in calls.enumerated() {
        let before = servers[index].map(CPUTime.process)
        let threadBefore = CPUTime.thread()
        samples[index] += try timeCalls(client, call, count: callsPerRound)
        clientCPU[index] += CPUTime.thread() - threadBefore
        for (server, pid) in servers[index].enumerated() {
          serverCPU[index][server] += CPUTime.process(pid) - before[server]
        }
      }
    }
    // Seconds in all → µs per call.
    let perCall = 1e6 / Double(max(1, rounds * callsPerRound))
    return (
      Stats(samples[0]), Stats(samples[1]), Stats(samples[2]), Stats(samples[3]), Stats(samples[4]),
      serverCPU.map { $0.map { $0 * perCall } },
      clientCPU.map { $0 * perCall }
    )
  }

  /// Calls per second for `connections` clients, each on its own connection and thread; floor,
  /// Ping, broker, direct-socket and p2p-floor phases alternate so drift hits all of them.
  func measureThroughput(connections: Int, directSocket: String, floorSocket: String) throws -> (
    floor: Double, ping: Double, broker: Double, direct: Double, p2pFloor: Double
  ) {
    var rates: [[Double]] = [[], [], [], [], []]
    for _ in 0..<phases {
      rates[0].append(try phase(.floor, connections: connections))
      rates[1].append(try phase(.ping, connections: connections))
      rates[2].append(try phase(.silent(clientID: "tessera-test"), connections: connections))
      rates[3].append(
        try phase(.silent(clientID: "tessera-test"), connections: connections) { try Direct.connect(directSocket) })
      rates[4].append(try phase(.p2pFloor, connections: connections) { try BusClient(directSocket: floorSocket) })
    }
    let p50 = rates.map { Stats($0).p50 }
    return (p50[0], p50[1], p50[2], p50[3], p50[4])
  }

  /// Median wall time (ms) of `tessera --bus token` (the session bus, as this row always measured),
  /// `tessera token` (which takes the direct socket by itself) and `busctl --user call` of the
  /// same silent call, and of `tessera --version` and `busctl --version` (start-up alone): each a
  /// whole process with its output discarded, interleaved.
  func measureCLI(tessera: String) throws -> (
    tessera: Double, direct: Double, busctl: Double, version: Double, busctlVersion: Double
  ) {
    try checkCLIConnection(tessera: tessera)
    let busctl = [
      "/usr/bin/busctl", "--user", "call", BrokerInterface.busName, BrokerInterface.objectPath,
      BrokerInterface.interfaceName, "AcquireTokenSilent", "sassa{sv}", "tessera-test", "0", "", "0",
    ]
    let commands = [
      [tessera, "--bus", "token", "--client-id", "tessera-test"], [tessera, "token", "--client-id", "tessera-test"],
      busctl, [tessera, "--version"], ["/usr/bin/busctl", "--version"],
    ]
    var times: [[Double]] = commands.map { _ in [] }
    for run in 0..<(cliRuns + 5) {
      let elapsed = try commands.map { try timeProcess($0) }
      if run >= 5 {  // the first runs warm the page cache
        for index in elapsed.indices { times[index].append(elapsed[index]) }
      }
    }
    let p50 = times.map { Stats($0).p50 }
    return (p50[0], p50[1], p50[2], p50[3], p50[4])
  }

  /// `tessera status --json` must say that the CLI reaches tesserad over its socket (else the
  /// direct CLI row would measure the bus).
  func checkCLIConnection(tessera: String) throws {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: tessera)
    process.arguments = ["status", "--json"]
    let pipe = Pipe()
    process.standardOutput = pipe
    try process.run()
    let output = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    process.waitUntilExit()
    let report = try? JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any]
    guard report?["connection"] as? String == "socket" else {
      throw BenchError("`tessera status --json` does not report the direct socket: \(output)")
    }
  }

  func timeProcess(_ argv: [String]) throws -> Double {
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
    var cArguments: [UnsafeMutablePointer<CChar>?] = argv.map { strdup($0) } + [nil]
    defer { cArguments.forEach { free($0) } }
    var pid: pid_t = 0
    let start = monotonic()
    let r = posix_spawn(&pid, cArguments[0]!, &actions, nil, &cArguments, environ)
    guard r == 0 else { throw BenchError("cannot run \(argv[0]): error \(r)") }
    var status: Int32 = 0
    _ = try? Syscall.check("waitpid") { waitpid(pid, &status, 0) }
    let elapsed = (monotonic() - start) * 1000
    guard status == 0 else { throw BenchError("\(argv.joined(separator: " ")) failed (status \(status))") }
    return elapsed
  }

  func phase(
    _ call: BrokerCall, connections: Int, connect: () throws -> BusClient = { try BusClient() }
  ) throws -> Double {
    let clients = try (0..<connections).map { _ in try connect() }
    let counts = UnsafeMutableBufferPointer<Int>.allocate(capacity: connections)
    counts.initialize(repeating: 0)
    defer { counts.deallocate() }
    let failures = Locked(0)
    let group = DispatchGroup()
    let start = DispatchSemaphore(value: 0)
    let duration = phaseSeconds
    for index in 0..<connections {
      group.enter()
      let client = UncheckedBox(clients[index])
      let slot = UncheckedBox(counts.baseAddress! + index)
      Thread.detachNewThread {
        start.wait()
        let end = monotonic() + duration
        var n = 0
        while monotonic() < end {
          do {
            _ = try client.value.call(
              destination: call.destination, path: call.path, interface: call.interface, member: call.member,
              arguments: call.arguments)
            n += 1
          } catch {
            failures.mutate { $0 += 1 }
          }
        }
        slot.value.pointee = n
        group.leave()
      }
    }
    let began = monotonic()
    for _ in 0..<connections { start.signal() }
    group.wait()
    let elapsed = monotonic() - began
    if failures.value > 0 { throw BenchError("\(failures.value) calls failed during a throughput phase") }
    return Double(counts.reduce(0, +)) / elapsed
  }

  func measureSingleFlight(env: Environment, client: BusClient) throws -> Int {
    let signedIn = try Broker.signIn(client, clientID: "tessera-short")
    _ = signedIn
    usleep(3_600_000)  // tessera-short tokens live 3 s
    let mark = env.idpLogLines()
    let count = 64
    let clients = try (0..<count).map { _ in try BusClient() }
    let group = DispatchGroup()
    let start = DispatchSemaphore(value: 0)
    let tokens = Locked<[String]>([])
    let call = BrokerCall.silent(clientID: "tessera-short", minValidity: 0)
    for c in clients {
      group.enter()
      let box = UncheckedBox(c)
      Thread.detachNewThread {
        start.wait()
        let reply = try? box.value.call(member: call.member, arguments: call.arguments, timeoutSeconds: 60)
        tokens.mutate { $0.append(reply?.first?.dictValue?["access_token"]?.stringValue ?? "(failed)") }
        group.leave()
      }
    }
    for _ in 0..<count { start.signal() }
    group.wait()
    let distinct = Set(tokens.value)
    guard !distinct.contains("(failed)") else { throw BenchError("a concurrent silent call failed") }
    return env.idpRequests(since: mark).filter { $0.grantType == "refresh_token" }.count
  }

  func measureRefresh(env: Environment, client: BusClient) throws -> (broker: Double, direct: Double) {
    // The broker's account for the device client.
    _ = try Broker.signInWithDeviceCode(client, clientID: "tessera-device", env: env)
    // The benchmark's own refresh token, from its own device-code sign-in, for the direct requests.
    var direct = try DirectClient(env: env)
    let force = BrokerCall.silent(clientID: "tessera-device", forceRefresh: true)
    var brokerTimes: [Double] = []
    var directTimes: [Double] = []
    _ = try direct.refresh()  // warm the connection
    for _ in 0..<refreshes {
      var start = monotonic()
      _ = try client.call(member: force.member, arguments: force.arguments, timeoutSeconds: 60)
      brokerTimes.append((monotonic() - start) * 1000)
      start = monotonic()
      try direct.refresh()
      directTimes.append((monotonic() - start) * 1000)
    }
    return (Stats(brokerTimes).p50, Stats(directTimes).p50)
  }

  func measureKeyringLoad() throws -> Double {
    var samples: [Double] = []
    for _ in 0..<max(3, startups) {
      let start = monotonic()
      _ = try blocking { try await SecretServiceStore().loadAll() }
      samples.append((monotonic() - start) * 1000)
    }
    return Stats(samples).p50
  }

  /// Milliseconds from exec (or from the first call, with activation) to the first silent token.
  func measureStartup(daemon: Daemon, activation: Bool) throws -> Double {
    var samples: [Double] = []
    let silent = BrokerCall.silent(clientID: "tessera-test")
    for _ in 0..<startups {
      daemon.stop()
      let client = try BusClient()
      let start = monotonic()
      if activation {
        _ = try client.call(member: silent.member, arguments: silent.arguments, timeoutSeconds: 30)
      } else {
        try daemon.launch()
        while !(try client.nameHasOwner(BrokerInterface.busName)) { usleep(200) }
        _ = try client.call(member: silent.member, arguments: silent.arguments, timeoutSeconds: 30)
      }
      samples.append((monotonic() - start) * 1000)
      if activation { daemon.adoptActivated() }
    }
    return Stats(samples).p50
  }

  /// Writes synthetic accounts and tokens in the documented schema (docs/storage.md).
  func populate(accounts: Int, clients: Int, scopeSets: Int, environment: Environment) throws {
    var cache = TokenCache()
    var operations: [TokenCache.StoreOperation] = []
    let env = environment.idpEnvironment
    let expires = Int64(Date().timeIntervalSince1970) + 3600
    for a in 0..<accounts {
      let id = "bench-\(a).bench"
      operations += cache.upsert(
        account: Account(
          id: id, username: "user\(a)@bench.test", name: "User \(a)", authority: environment.authority,
          environment: env, realm: "bench", localAccountID: "\(a)"))
      for c in 0..<clients {
        let clientID = "bench-client-\(c)"
        operations += cache.upsert(
          refreshToken: RefreshTokenRecord(
            accountID: id, environment: env, clientID: clientID, authority: environment.authority,
            secret: String(repeating: "r", count: 400)))
        for s in 0..<scopeSets {
          operations += cache.insert(
            accessToken: AccessTokenRecord(
              accountID: id, environment: env, realm: "bench", clientID: clientID, scopes: ["scope-\(s)"],
              secret: String(repeating: "a", count: 1500), tokenType: "Bearer", expiresOn: expires,
              idToken: String(repeating: "i", count: 900)))
        }
      }
    }
    // Into the keyring's in-memory session collection: the login keyring rewrites its whole file on
    // every item, which would take many minutes for thousands of items. The broker loads every
    // collection, so it sees them the same way.
    log("writing \(operations.count) keyring items")
    let store = SecretServiceStore(collection: "session")
    let items = operations.compactMap { if case .save(let item) = $0 { item } else { nil } }
    try blocking {
      for item in items { try await store.save(item) }
    }
  }
}

func log(_ text: String) {
  FileHandle.standardError.write(Data("tessera-bench: \(text)\n".utf8))
}

func fmt(_ value: Double) -> String {
  value >= 100
    ? String(format: "%.0f", value) : value >= 10 ? String(format: "%.1f", value) : String(format: "%.2f", value)
}

extension Bench {
  /// Starts Xvfb, then the app (TESSERA_ACCOUNTS_REPORT=1: it prints CLOCK_MONOTONIC microseconds
  /// at its first frame and when the accounts are drawn); the RSS is read once it is idle.
  func measureAccountsApp(_ binary: String, accounts: Int) throws -> (
    firstFrame: Double, accountsShown: Double, rss: Double
  ) {
    let xvfb = try Spawned(["/usr/bin/Xvfb", "-displayfd", "1", "-screen", "0", "1024x768x24", "-nolisten", "tcp"])
    defer { xvfb.stop() }
    guard let display = xvfb.readLine(timeout: 30), Int(display) != nil else { throw BenchError("Xvfb did not start") }
    var firstFrames: [Double] = []
    var shown: [Double] = []
    var rss = Double.nan
    for run in 0..<(smoke ? 1 : 5) {
      let start = monotonic()
      let app = try Spawned(
        [binary],
        environment: [
          // The issue's conditions: the cairo renderer and GL off (GTK 4.8 otherwise loads Mesa's
          // software GL, LLVM with it, about 60 MiB, even to draw with cairo).
          "DISPLAY": ":" + display, "GSK_RENDERER": "cairo", "GDK_DEBUG": "gl-disable",
          "TESSERA_ACCOUNTS_REPORT": "1",
        ])
      defer { app.stop() }
      var frame: Double?
      var drawn: Double?
      while frame == nil || drawn == nil {
        guard let line = app.readLine(timeout: 60) else { throw BenchError("the app said nothing for 60 s") }
        let fields = line.split(separator: " ")
        guard let micros = fields.last.flatMap({ Double($0) }) else { continue }
        if fields.first == "first-frame" { frame = micros / 1e6 - start }
        if fields.first == "accounts-shown" {
          // The loaded cache's accounts, and the one the benchmark signed in.
          guard fields.count == 3, let count = Int(fields[1]), count >= accounts else {
            throw BenchError("the app drew \(fields.dropFirst().first ?? "?") accounts, not \(accounts) or more")
          }
          drawn = micros / 1e6 - start
        }
      }
      firstFrames.append(frame! * 1000)
      shown.append(drawn! * 1000)
      if run == 0 {
        usleep(1_000_000)  // idle: nothing left to draw or read
        rss = Daemon.rssMiB(of: app.pid)
      }
    }
    return (Stats(firstFrames).p50, Stats(shown).p50, rss)
  }
}

func monotonic() -> Double {
  var now = timespec()
  clock_gettime(CLOCK_MONOTONIC, &now)
  return Double(now.tv_sec) + Double(now.tv_nsec) / 1e9
}

struct BenchError: Error, CustomStringConvertible {
  let description: String
  init(_ description: String) { self.description = description }
}

/// Runs async work from synchronous benchmark code (on a thread of its own, not the caller's).
func blocking<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) throws -> T {
  let done = DispatchSemaphore(value: 0)
  let result = Locked<Result<T, any Error>?>(nil)
  Task.detached {
    do {
      let value = try await body()
      result.mutate { $0 = .success(value) }
    } catch {
      result.mutate { $0 = .failure(error) }
    }
    done.signal()
  }
  done.wait()
  return try result.value!.get()
}

/// A value handed to exactly one other thread.
struct UncheckedBox<T>: @unchecked Sendable {
  let value: T
  init(_ value: T) { self.value = value }
}

final class Locked<T>: @unchecked Sendable {
  private var stored: T
  private let lock = NSLock()
  init(_ value: T) { stored = value }
  var value: T { lock.withLock { stored } }
  func mutate(_ body: (inout T) -> Void) { lock.withLock { body(&stored) } }
}

/// Runs `body` against a tesserad restarted with `access_mode` set, then restarts it as it was.
func withAccessMode<T>(_ mode: String, daemon: Daemon, env: Environment, _ body: () throws -> T) throws -> T {
  let base = (ProcessInfo.processInfo.environment["XDG_CONFIG_HOME"] ?? "") + "/tessera/config.toml"
  let text = (try? String(contentsOfFile: base, encoding: .utf8)) ?? ""
  let lines = text.split(separator: "\n", omittingEmptySubsequences: false).filter { !$0.hasPrefix("access_mode") }
  let path = env.sessionDir + "/bench-access-\(mode).toml"
  try (lines.joined(separator: "\n") + "\naccess_mode = \"\(mode)\"\n").write(
    toFile: path, atomically: true, encoding: .utf8)
  daemon.stop()
  daemon.arguments = ["--config", path]
  try daemon.start()
  defer {
    daemon.stop()
    daemon.arguments = []
    try? daemon.start()
  }
  return try body()
}
