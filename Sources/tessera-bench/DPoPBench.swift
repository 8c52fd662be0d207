import ArgumentParser
import Foundation
import TesseraBus
import TesseraCore
import TesseraInterface
import TesseraPlatform
import TesseraTestSupport

#if canImport(Glibc)
  import Glibc
#endif

/// What binding tokens to this machine costs (issue 40, RFC 9449): a refresh with a proof against
/// one without, at the same server (glewlwyd's OpenID Connect plugin, DPoP with server nonces),
/// and the time to make one proof with a software key and with a key in a TPM (swtpm).
extension Bench {
  struct ProofTimes {
    var software: Stats
    /// nil with the reason where swtpm or tpm2-tss is missing.
    var tpm: Result<Stats, BenchError>
  }

  /// Microseconds per proof: the JSON, base64url and the signature, as tesserad makes one for a
  /// token request or GetProof (a nonce and an access token hash included).
  func measureProofs(scratch: String) throws -> ProofTimes {
    try Self.measureProofs(scratch: scratch, quick: smoke)
  }

  static func measureProofs(scratch: String, quick: Bool) throws -> ProofTimes {
    let software = try proofSamples(source: SoftwareProofKeys(), kind: .software, count: quick ? 50 : 2000)
    let tpm: Result<Stats, BenchError>
    if SoftwareTPM.binary == nil {
      tpm = .failure(BenchError("swtpm is not installed (apt-get install swtpm)"))
    } else {
      let state = scratch + "/swtpm"
      try FileManager.default.createDirectory(atPath: state, withIntermediateDirectories: true)
      let swtpm = try SoftwareTPM(state: state)
      defer { swtpm.stop() }
      let keys = TPMProofKeys(tcti: swtpm.tcti, summary: "swtpm")
      do {
        tpm = .success(Stats(try proofSamples(source: keys, kind: .tpm, count: quick ? 5 : 100)))
      } catch let error as BenchError {
        tpm = .failure(error)
      } catch {
        tpm = .failure(BenchError("swtpm: \(error)"))
      }
    }
    return ProofTimes(software: Stats(software), tpm: tpm)
  }

  private static func proofSamples(source: any ProofKeySource, kind: ProofKeyKind, count: Int) throws -> [Double] {
    try blocking {
      let made = try await source.create()
      guard made.kind == kind else {
        throw BenchError("no \(kind.rawValue) key could be made: \(source.summary)")
      }
      let key = ProofKeyRecord(accountID: "bench", kind: made.kind, jwk: made.jwk, blob: made.blob, createdAt: 0)
      var samples: [Double] = []
      for index in 0..<(count + count / 10) {  // the first tenth warms up
        let start = monotonic()
        _ = try await ProofBuilder.proof(
          key: key, source: source, method: "GET", url: "https://resource.example/api/items?page=2", now: Date(),
          nonce: "server-nonce-\(index)", accessToken: "access-token-\(index)")
        if index >= count / 10 { samples.append((monotonic() - start) * 1_000_000) }
      }
      return samples
    }
  }

  /// Milliseconds per forced refresh through tesserad, medians of interleaved rounds: an account
  /// whose tokens are bearer (signed in with dpop = "off") and one whose tokens are bound to a
  /// software key (dpop = "auto"), at the same glewlwyd. Each answer's token type is checked, so a
  /// binding that silently fell away would stop the benchmark rather than flatter it.
  func measureDPoPRefresh(daemon: Daemon, env: Environment) throws -> (plain: Stats, dpop: Stats, keyKind: String) {
    let glewlwyd = try Glewlwyd(env: env)
    defer { glewlwyd.stop() }
    defer {
      daemon.stop()
      daemon.arguments = []
      try? daemon.start()
    }
    let name = "bench-dpop"
    var accounts: [(id: String, binding: String)] = []
    for (user, mode) in [("alice", "off"), ("bob", "auto")] {
      let table = """

        [[provider]]
        name = "\(name)"
        discovery = "openid"
        issuer = "\(glewlwyd.issuer)"
        client_id = "\(glewlwyd.clientID)"
        scopes = ["read"]
        dpop = "\(mode)"

        """
      let path = env.sessionDir + "/bench-dpop-\(mode).toml"
      try (baseConfig() + table).write(toFile: path, atomically: true, encoding: .utf8)
      daemon.stop()
      daemon.arguments = ["--config", path]
      try daemon.start()
      let client = try BusClient()
      let reply = try Broker.signInWithDeviceCode(
        client, clientID: "", options: ["provider": .string(name)],
        approve: { try glewlwyd.approve(user: user, userCode: $0) })
      guard let id = reply["account"]?.dictValue?["id"]?.stringValue else {
        throw BenchError("the device-code sign-in at glewlwyd named no account")
      }
      accounts.append((id, reply["token_type"]?.stringValue ?? "?"))
    }
    guard accounts[0].binding.lowercased() == "bearer", accounts[1].binding == DPoP.tokenType else {
      throw BenchError("expected a Bearer and a DPoP account, got \(accounts.map(\.binding))")
    }
    let client = try BusClient()
    // Where tesserad made the key (a TPM it may use, else software): the row says which.
    let status = try client.call(member: "GetStatus", arguments: []).first?.dictValue
    let keyKind = status?["dpop"]?.dictValue?["kind"]?.stringValue ?? "?"
    var samples: [[Double]] = [[], []]
    for round in 0..<(refreshes + 2) {  // two rounds warm up
      for (index, account) in accounts.enumerated() {
        let start = monotonic()
        let reply = try client.call(
          member: "AcquireTokenSilent",
          arguments: [
            .string(""), .strings([]), .string(account.id),
            .dict(["provider": .string(name), "force_refresh": .bool(true)]),
          ], timeoutSeconds: 60)
        let elapsed = (monotonic() - start) * 1000
        let type = reply.first?.dictValue?["token_type"]?.stringValue ?? "?"
        guard (type == DPoP.tokenType) == (index == 1) else {
          throw BenchError("a refresh of the \(index == 1 ? "bound" : "bearer") account answered a \(type) token")
        }
        if round >= 2 { samples[index].append(elapsed) }
      }
    }
    // Gone before the later rows load the keyring (and revoked at glewlwyd).
    for account in accounts {
      _ = try client.call(member: "SignOut", arguments: [.string(account.id), .dict([:])], timeoutSeconds: 60)
    }
    return (Stats(samples[0]), Stats(samples[1]), keyKind)
  }

  /// The session's config.toml, which scripts/test-session wrote.
  private func baseConfig() -> String {
    let path = (ProcessInfo.processInfo.environment["XDG_CONFIG_HOME"] ?? "") + "/tessera/config.toml"
    return (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
  }
}

/// `tessera-bench proofs`: the proof rows alone, without a session (a quick check of a change to
/// how proofs are made).
struct ProofsCommand: ParsableCommand {
  static let configuration = CommandConfiguration(
    commandName: "proofs", abstract: "Time DPoP proofs with a software key and with a key in swtpm.")

  func run() throws {
    var template = Array("/tmp/tessera-bench-XXXXXX".utf8CString)
    let scratch = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
    defer { try? FileManager.default.removeItem(atPath: scratch) }
    let times = try Bench.measureProofs(scratch: scratch, quick: false)
    print("software key: median \(fmt(times.software.p50)) µs, p99 \(fmt(times.software.p99)) µs")
    switch times.tpm {
    case .success(let tpm): print("key in swtpm: median \(fmt(tpm.p50)) µs, p99 \(fmt(tpm.p99)) µs")
    case .failure(let why): print("key in swtpm: not measured (\(why))")
    }
  }
}

/// glewlwyd, configured and served by Tests/e2e/glewlwyd_serve.py (the e2e tests' own set-up),
/// which also plays the user who approves a device code.
final class Glewlwyd: @unchecked Sendable {
  private(set) var issuer = ""
  private(set) var clientID = ""
  private let process = Process()
  private let input = Pipe()
  private let output = Pipe()
  private var buffered: [UInt8] = []

  init(env: Environment) throws {
    process.executableURL = URL(fileURLWithPath: env.idpPython)
    process.arguments = [env.repo + "/Tests/e2e/glewlwyd_serve.py"]
    process.standardInput = input
    process.standardOutput = output
    let log = env.sessionDir + "/bench-glewlwyd.log"
    FileManager.default.createFile(atPath: log, contents: nil)
    process.standardError = FileHandle(forWritingAtPath: log) ?? .nullDevice
    try process.run()
    // Our ends of its pipes are ours alone: a tesserad started later must not hold its input open
    // (glewlwyd stops when the input ends).
    for fd in [input.fileHandleForWriting.fileDescriptor, output.fileHandleForReading.fileDescriptor] {
      _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
    }
    struct Ready: Decodable {
      let issuer: String
      let client_id: String
    }
    guard let line = readLine(), let ready = try? JSONDecoder().decode(Ready.self, from: Data(line.utf8)) else {
      throw BenchError("glewlwyd did not start; see \(env.sessionDir)/bench-glewlwyd.log")
    }
    issuer = ready.issuer
    clientID = ready.client_id
  }

  func approve(user: String, userCode: String) throws {
    input.fileHandleForWriting.write(Data("approve \(user) \(userCode)\n".utf8))
    let answer = readLine()
    guard answer == "ok" else { throw BenchError("glewlwyd: approving \(userCode) failed: \(answer ?? "no answer")") }
  }

  /// One line of the helper's output, without its newline; nil at its end.
  private func readLine() -> String? {
    while true {
      if let newline = buffered.firstIndex(of: 0x0A) {
        let line = String(decoding: buffered[..<newline], as: UTF8.self)
        buffered.removeSubrange(...newline)
        return line
      }
      let more = output.fileHandleForReading.availableData
      guard !more.isEmpty else { return nil }
      buffered += more
    }
  }

  /// The end of its input stops glewlwyd and the helper.
  func stop() {
    try? input.fileHandleForWriting.close()
    process.waitUntilExit()
  }
}
