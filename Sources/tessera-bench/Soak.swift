import ArgumentParser
import Foundation
import TesseraBus
import TesseraCore
import TesseraInterface
import TesseraSystem

/// The fault suite's soak (issue 12, part 5): many connections, each making silent calls one after
/// another for an account that is already signed in, while the daemon's refresh-ahead renews its
/// short-lived token. Prints one JSON object: calls, errors (with the first few), latency
/// percentiles and throughput. The daemon's memory, descriptors and threads are measured by the
/// caller (Tests/e2e/test_faults_soak.py), before and after.
struct Soak: ParsableCommand {
  static let configuration = CommandConfiguration(
    abstract: "Silent calls from many connections at once, counting errors (the fault suite's soak).")

  @Option(help: "Connections, each on a thread of its own.") var clients = 16
  @Option(help: "Silent calls per connection.") var calls = 100_000
  @Option(help: "The client id to ask tokens for (its account must be signed in).") var clientID = "tessera-test"

  func run() throws {
    let silent = BrokerCall.silent(clientID: clientID)
    let connections = try (0..<clients).map { _ in try BusClient() }
    let results = Locked<[(latencies: [Double], errors: [String], failed: Int)]>([])
    let group = DispatchGroup()
    let count = calls
    let began = monotonic()
    for index in 0..<clients {
      group.enter()
      let client = UncheckedBox(connections[index])
      Thread.detachNewThread {
        var latencies: [Double] = []
        latencies.reserveCapacity(count)
        var errors: [String] = []
        var failed = 0
        for _ in 0..<count {
          let start = monotonic()
          do {
            _ = try client.value.call(member: silent.member, arguments: silent.arguments)
            latencies.append(monotonic() - start)
          } catch {
            failed += 1
            if errors.count < 5 { errors.append("\(error)") }
          }
        }
        results.mutate { $0.append((latencies, errors, failed)) }
        group.leave()
      }
    }
    group.wait()
    let elapsed = monotonic() - began
    let all = results.value
    let stats = Stats(all.flatMap(\.latencies))
    let summary: [String: Any] = [
      "clients": clients, "calls": clients * count, "errors": all.map(\.failed).reduce(0, +),
      "first_errors": Array(all.flatMap(\.errors).prefix(5)), "seconds": elapsed,
      "calls_per_second": Double(clients * count) / elapsed,
      "p50_us": stats.p50 * 1e6, "p99_us": stats.p99 * 1e6,
    ]
    let data = try JSONSerialization.data(withJSONObject: summary, options: [.sortedKeys])
    print(String(decoding: data, as: UTF8.self))
  }
}
