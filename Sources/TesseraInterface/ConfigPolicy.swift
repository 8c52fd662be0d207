/// The administrator's files, the user's file, and what comes of both (issue 26).
///
/// tesserad reads `/etc/tessera/config.toml`, then `/etc/tessera/config.d/*.toml` in name order,
/// then the user's config.toml. A later file's key replaces an earlier one's, except where the
/// administrator's `[policy]` says the user may not: a locked key, an `access_mode` below the
/// minimum, a store the policy does not allow. Such a setting of the user's is ignored with one
/// warning (in the log and in `tessera status`); a mistake in any file refuses the whole
/// configuration. `ConfigFiles` (TesseraBus) reads the files; this is the reading of their text and
/// the combining, shared by tesserad and `tessera config`.

/// Where a key's value came from: a file and line, or nothing (the default).
public struct ConfigSource: Sendable, Equatable, CustomStringConvertible {
  public var path: String
  public var line: Int
  /// What in the file, when it is not a line of its own (the policy's minimum that raised a key).
  public var note: String?

  public init(path: String, line: Int, note: String? = nil) {
    self.path = path
    self.line = line
    self.note = note
  }

  /// "PATH:LINE", or "PATH (NOTE)".
  public var description: String { note.map { "\(path) (\($0))" } ?? "\(path):\(line)" }
}

/// The administrator's `[policy]` table: what a user's config.toml may not change.
///
///     [policy]
///     locked = ["trusted_authorities", "ca_file"]   # keys only these files set
///     minimum_access_mode = "confirm"               # the user may be stricter, never looser
///     allow_forwarding = false                      # `tessera forward` refused
///     allowed_stores = ["secret-service"]           # where accounts and tokens may be kept
///
/// Several files' tables add up, the strictest winning: the union of `locked`, the highest
/// minimum, forwarding only when every file allows it, the stores every file allows.
public struct ConfigPolicy: Sendable, Equatable {
  /// Keys a user's file may not set (in the table's order).
  public var locked: [BrokerConfig.Key] = []
  /// The loosest access_mode a user may choose; nil: any.
  public var minimumAccessMode: AccessMode?
  /// The file whose `[policy]` set the minimum in force.
  public var minimumAccessModeFile: String?
  /// Whether `tessera forward` may make forwards of the socket.
  public var allowForwarding = true
  /// The stores that may hold accounts and tokens; nil: any.
  public var allowedStores: [StoreKind]?
  /// The providers (`[[provider]]` names) that may be used; nil: any.
  public var allowedProviders: [String]?
  /// Whether a user's `[[provider]]` tables are ignored (`locked = ["provider"]`): only the
  /// administrator's providers are used.
  public var providersLocked = false
  /// The files whose `[policy]` tables made this, in the order read.
  public var files: [String] = []

  public init() {}

  /// The table's keys.
  public enum Key: String, CaseIterable, Sendable {
    case locked
    case minimumAccessMode = "minimum_access_mode"
    case allowForwarding = "allow_forwarding"
    case allowedStores = "allowed_stores"
    case allowedProviders = "allowed_providers"
  }

  /// Whether nothing is restricted.
  public var isEmpty: Bool {
    locked.isEmpty && minimumAccessMode == nil && allowForwarding && allowedStores == nil && allowedProviders == nil
      && !providersLocked
  }

  /// Whether the store may hold accounts and tokens.
  public func allows(_ store: StoreKind) -> Bool { allowedStores?.contains(store) ?? true }

  /// Whether `store` may be configured: `auto` always (it chooses among the allowed ones).
  public func allows(_ choice: BrokerConfig.StoreChoice) -> Bool { choice.kind.map(allows) ?? true }

  /// `mode` raised to the minimum.
  public func floor(_ mode: AccessMode) -> AccessMode {
    guard let minimum = minimumAccessMode, mode.strictness < minimum.strictness else { return mode }
    return minimum
  }

  /// This policy, made at least as strict as `other`.
  mutating func tighten(with other: ConfigPolicy) {
    for key in other.locked where !locked.contains(key) { locked.append(key) }
    if let theirs = other.minimumAccessMode, theirs.strictness > (minimumAccessMode?.strictness ?? -1) {
      minimumAccessMode = theirs
      minimumAccessModeFile = other.minimumAccessModeFile
    }
    allowForwarding = allowForwarding && other.allowForwarding
    if let theirs = other.allowedStores {
      allowedStores = allowedStores.map { mine in mine.filter(theirs.contains) } ?? theirs
    }
    if let theirs = other.allowedProviders {
      allowedProviders = allowedProviders.map { mine in mine.filter(theirs.contains) } ?? theirs
    }
    providersLocked = providersLocked || other.providersLocked
    files += other.files
  }

  /// The table's value for `key`, as a file writes it; nil when it is not set.
  public func value(of key: Key) -> ConfigFile.Value? {
    switch key {
    case .locked: locked.isEmpty ? nil : .array(locked.map { .string($0.rawValue) })
    case .minimumAccessMode: minimumAccessMode.map { .string($0.rawValue) }
    case .allowForwarding: .bool(allowForwarding)
    case .allowedStores: allowedStores.map { .array($0.map { .string($0.rawValue) }) }
    case .allowedProviders: allowedProviders.map { .array($0.map { .string($0) }) }
    }
  }

  /// Reads a `[policy]` table; its problems carry their lines.
  static func parse(_ table: ConfigFile.Table, path: String) -> (ConfigPolicy, [ConfigProblem]) {
    var policy = ConfigPolicy()
    policy.files = [path]
    var problems: [ConfigProblem] = []
    func problem(_ entry: ConfigFile.Entry, _ reason: String) {
      problems.append(
        ConfigProblem(path: path, line: entry.line, key: entry.key, kind: .inSection("policy"), reason: reason))
    }
    for entry in table.entries {
      guard let key = Key(rawValue: entry.key) else {
        if BrokerConfig.Key(rawValue: entry.key) != nil {
          problem(
            entry,
            "is a setting, not a policy key: in TOML every key after the [policy] header belongs to that table, so write settings above [policy]"
          )
          continue
        }
        problem(entry, "unknown key; " + NearestName.suggestion(for: entry.key, among: Key.allCases.map(\.rawValue)))
        continue
      }
      switch key {
      case .locked:
        guard let names = entry.value.strings else {
          problem(entry, "must be an array of setting names, e.g. [\"trusted_authorities\"]")
          continue
        }
        for name in names {
          if name == "provider" {
            policy.providersLocked = true
            continue
          }
          guard let locked = BrokerConfig.Key(rawValue: name) else {
            problem(
              entry,
              "'\(SafeText.clip(name, limit: 200))' is not a setting; "
                + NearestName.suggestion(for: name, among: BrokerConfig.keys))
            continue
          }
          if !policy.locked.contains(locked) { policy.locked.append(locked) }
        }
      case .minimumAccessMode:
        guard let text = entry.value.string, let mode = AccessMode(rawValue: text) else {
          problem(entry, "must be one of \(AccessMode.allCases.map(\.rawValue).joined(separator: ", "))")
          continue
        }
        policy.minimumAccessMode = mode
        policy.minimumAccessModeFile = path
      case .allowForwarding:
        guard let flag = entry.value.bool else {
          problem(entry, "must be true or false")
          continue
        }
        policy.allowForwarding = flag
      case .allowedStores:
        let names = StoreKind.allCases.map(\.rawValue).joined(separator: ", ")
        guard let list = entry.value.strings, !list.isEmpty else {
          problem(entry, "must be a non-empty array of stores: \(names)")
          continue
        }
        var stores: [StoreKind] = []
        for name in list {
          guard let store = StoreKind(rawValue: name) else {
            problem(entry, "'\(SafeText.clip(name, limit: 200))' is not a store; the stores are \(names)")
            continue
          }
          if !stores.contains(store) { stores.append(store) }
        }
        policy.allowedStores = stores
      case .allowedProviders:
        guard let list = entry.value.strings, list.allSatisfy(ProviderConfig.isName) else {
          problem(entry, "must be an array of provider names (the name = of [[provider]] tables)")
          continue
        }
        policy.allowedProviders = list
      }
    }
    return (policy, problems)
  }
}

extension AccessMode {
  /// open < confirm < strict.
  var strictness: Int {
    switch self {
    case .open: 0
    case .confirm: 1
    case .strict: 2
    }
  }
}

/// One file, read and checked: its settings (each with its line), its `[[git]]` entries and, in an
/// administrator's file, its `[policy]`.
public struct ConfigLayer: Sendable, Equatable {
  public struct Setting: Sendable, Equatable {
    public var key: BrokerConfig.Key
    public var value: ConfigFile.Value
    public var line: Int
  }

  public var path: String
  /// Whether this is one of the administrator's files (which may hold `[policy]`).
  public var isSystem: Bool
  public var settings: [Setting] = []
  public var gitRules: [GitCredentialRule] = []
  public var providers: [ProviderConfig] = []
  public var policy: ConfigPolicy?

  /// Checks a file's bytes: every problem it has, each with its line (a TOML syntax error stops
  /// the reading, so it comes alone).
  public static func parse(bytes: [UInt8], path: String, isSystem: Bool) throws(ConfigProblems) -> ConfigLayer {
    let file: ConfigFile
    do {
      file = try ConfigFile(parsing: bytes)
    } catch {
      throw ConfigProblems([ConfigProblem(path: path, line: error.line, reason: error.reason)])
    }
    var layer = ConfigLayer(path: path, isSystem: isSystem)
    var scratch = BrokerConfig()
    var problems: [ConfigProblem] = []
    for entry in file.entries {
      guard let key = BrokerConfig.Key(rawValue: entry.key) else {
        problems.append(
          ConfigProblem(
            path: path, line: entry.line, key: entry.key,
            reason: "unknown key; " + NearestName.suggestion(for: entry.key, among: BrokerConfig.keys)))
        continue
      }
      do {
        try scratch.set(key, entry.value)
        layer.settings.append(Setting(key: key, value: entry.value, line: entry.line))
      } catch {
        problems.append(ConfigProblem(path: path, line: entry.line, key: entry.key, reason: error.reason))
      }
    }
    // A user's file knows [[git]] alone; the administrator's also [policy].
    let names = BrokerConfig.tableNames + (isSystem ? BrokerConfig.sectionNames : [])
    for table in file.tables {
      let known = table.isArray ? BrokerConfig.tableNames : BrokerConfig.sectionNames
      if known.contains(table.name) {
        if table.name == "policy" && !isSystem {
          problems.append(
            ConfigProblem(
              path: path, line: table.line, key: table.name, kind: .section,
              reason:
                "is read only from the administrator's files (\(ConfigLocation.systemDirectory)/config.toml and config.d/*.toml), never from a user's; remove it from this file"
            ))
        }
        continue
      }
      let other = (table.isArray ? BrokerConfig.sectionNames : BrokerConfig.tableNames).contains(table.name)
      problems.append(
        ConfigProblem(
          path: path, line: table.line, key: table.name, kind: table.isArray ? .table : .section,
          reason: other
            ? (table.isArray
              ? "write [\(table.name)]: it is one table, not a list of entries"
              : "write [[\(table.name)]]: each entry is a [[\(table.name)]] of its own")
            : "unknown table; "
              + NearestName.suggestion(
                for: table.name, among: names,
                quoted: { BrokerConfig.sectionNames.contains($0) ? "[\($0)]" : "[[\($0)]]" },
                listed: { BrokerConfig.sectionNames.contains($0) ? "[\($0)]" : "[[\($0)]]" },
                known: names.count == 1 ? "the only table is" : "the only tables are")))
    }
    for table in file.tables(named: "git") where table.isArray {
      do {
        var rule = try GitCredentialRule(table: table)
        rule.file = path
        layer.gitRules.append(rule)
      } catch {
        problems.append(
          ConfigProblem(path: path, line: error.line, key: error.key, kind: .inTable("git"), reason: error.reason))
      }
    }
    let (providers, providerProblems) = ProviderConfig.providers(in: file, path: path)
    layer.providers = providers
    problems += providerProblems.map {
      ConfigProblem(path: path, line: $0.line, key: $0.key, kind: .inTable("provider"), reason: $0.reason)
    }
    if isSystem, let table = file.tables.first(where: { $0.name == "policy" && !$0.isArray }) {
      let (policy, found) = ConfigPolicy.parse(table, path: path)
      layer.policy = policy
      problems += found
    }
    guard problems.isEmpty else { throw ConfigProblems(problems.sorted { ($0.line ?? 0) < ($1.line ?? 0) }) }
    return layer
  }
}

/// The configuration in force: every file combined under the administrator's policy.
public struct EffectiveConfig: Sendable, Equatable {
  public var config: BrokerConfig
  public var policy: ConfigPolicy
  /// The files read, in order (administrator's first).
  public var files: [String]
  /// Where each key set by a file came from; a key not here has its default.
  public var sources: [BrokerConfig.Key: ConfigSource]
  /// The user's settings the policy ignored, one sentence each ("PATH:LINE: key 'K' …").
  public var warnings: [String]

  public init(
    config: BrokerConfig = BrokerConfig(), policy: ConfigPolicy = ConfigPolicy(), files: [String] = [],
    sources: [BrokerConfig.Key: ConfigSource] = [:], warnings: [String] = []
  ) {
    self.config = config
    self.policy = policy
    self.files = files
    self.sources = sources
    self.warnings = warnings
  }

  /// Combines the administrator's files (in order) and the user's file. A file of the
  /// administrator's that breaks the policy (an access_mode below its minimum, a store it does
  /// not allow) is a problem of the whole configuration; a user's setting that does is ignored,
  /// with a warning.
  public static func combine(system: [ConfigLayer], user: ConfigLayer?) throws(ConfigProblems) -> EffectiveConfig {
    var effective = EffectiveConfig()
    for layer in system {
      if let policy = layer.policy { effective.policy.tighten(with: policy) }
    }
    let policy = effective.policy
    var problems: [ConfigProblem] = []
    if policy.allowedStores?.isEmpty == true {
      problems.append(
        ConfigProblem(
          path: policy.files.joined(separator: ", "), line: nil,
          reason:
            "the allowed_stores of these [policy] tables have no store in common, so no store could be used; an administrator can make them agree"
        ))
    }
    for layer in system {
      effective.files.append(layer.path)
      for setting in layer.settings {
        if let reason = effective.breach(setting) {
          problems.append(
            ConfigProblem(path: layer.path, line: setting.line, key: setting.key.rawValue, reason: reason))
          continue
        }
        effective.apply(setting, from: layer.path)
      }
      effective.config.gitRules += layer.gitRules
      effective.addProviders(layer.providers, isSystem: true)
    }
    guard problems.isEmpty else { throw ConfigProblems(problems) }
    if let user {
      effective.files.append(user.path)
      for setting in user.settings {
        let source = ConfigSource(path: user.path, line: setting.line)
        if policy.locked.contains(setting.key) {
          // The same value as in force is no override: nothing to warn about.
          var scratch = effective.config
          try? scratch.set(setting.key, setting.value)
          guard scratch.value(of: setting.key) != effective.config.value(of: setting.key) else { continue }
          let from = effective.sources[setting.key].map { "; the administrator's value (\($0)) stays" } ?? ""
          effective.warnings.append(
            "\(source): key '\(setting.key.rawValue)' is locked by the administrator's [policy] (\(policy.files.joined(separator: ", "))), so this setting is ignored\(from)"
          )
          continue
        }
        if let reason = effective.breach(setting) {
          effective.warnings.append("\(source): key '\(setting.key.rawValue)': \(reason), so this setting is ignored")
          continue
        }
        effective.apply(setting, from: user.path)
      }
      effective.config.gitRules += user.gitRules
      effective.addProviders(user.providers, isSystem: false)
    }
    // The default, or a file's, raised to the minimum: then the minimum is where it comes from.
    let raised = policy.floor(effective.config.accessMode)
    if raised != effective.config.accessMode {
      effective.config.accessMode = raised
      effective.sources[.accessMode] = ConfigSource(
        path: policy.minimumAccessModeFile ?? "", line: 0, note: "[policy] minimum_access_mode")
    }
    return effective
  }

  /// A file's providers, under the policy: a user's are ignored when the administrator locked
  /// them, a provider the policy does not allow is ignored, and a user's provider may not take
  /// the name of the administrator's; each with a warning naming the file and line.
  mutating func addProviders(_ providers: [ProviderConfig], isSystem: Bool) {
    for provider in providers {
      let source = ConfigSource(path: provider.file, line: provider.line)
      if !isSystem && policy.providersLocked {
        warnings.append(
          "\(source): [[provider]] '\(provider.name)' is ignored: the administrator's [policy] (\(policy.files.joined(separator: ", "))) locks providers; use theirs (`tessera provider list`)"
        )
        continue
      }
      // A provider is trusted as its issuer: where the administrator locked the trust, a user's
      // provider may only name an issuer the administrator trusts.
      // Its endpoints written out and its user API too: a trusted issuer with a token endpoint
      // elsewhere would send the codes and refresh tokens there.
      if !isSystem, policy.locked.contains(.trustedAuthorities),
        let outside =
          ([provider.issuer] + provider.endpoints.all.compactMap(\.url) + [provider.userAPI?.url].compactMap { $0 })
          .first(where: { !Self.isWithin($0, config.trustedAuthorities) })
      {
        let what = outside == provider.issuer ? "its issuer" : "its endpoint"
        warnings.append(
          "\(source): [[provider]] '\(provider.name)' is ignored: \(what) \(outside) is not among the administrator's trusted_authorities, which the [policy] locks"
        )
        continue
      }
      if let allowed = policy.allowedProviders, !allowed.contains(provider.name) {
        warnings.append(
          "\(source): [[provider]] '\(provider.name)' is ignored: it is not among the administrator's allowed_providers (\(allowed.joined(separator: ", ")))"
        )
        continue
      }
      if let taken = config.providers.first(where: { $0.name == provider.name }) {
        warnings.append(
          "\(source): [[provider]] '\(provider.name)' is ignored: the administrator's provider of that name (\(taken.file):\(taken.line)) is used; give yours another name"
        )
        continue
      }
      var provider = provider
      provider.fromAdministrator = isSystem
      config.providers.append(provider)
    }
  }

  /// Whether `url` is one of `prefixes` or below one (scheme and host compared without case).
  static func isWithin(_ url: String, _ prefixes: [String]) -> Bool {
    func trimmed(_ s: String) -> String {
      let lower = s.lowercased()
      return lower.hasSuffix("/") ? String(lower.dropLast()) : lower
    }
    let target = trimmed(url)
    return prefixes.map(trimmed).contains { target == $0 || target.hasPrefix($0 + "/") }
  }

  /// Why the policy does not allow `setting`'s value; nil when it does.
  func breach(_ setting: ConfigLayer.Setting) -> String? {
    var scratch = BrokerConfig()
    try? scratch.set(setting.key, setting.value)
    switch setting.key {
    case .accessMode:
      guard let minimum = policy.minimumAccessMode, scratch.accessMode.strictness < minimum.strictness else {
        return nil
      }
      return
        "'\(scratch.accessMode.rawValue)' is below the administrator's minimum_access_mode '\(minimum.rawValue)' ([policy] in \(policy.files.joined(separator: ", ")))"
    case .store:
      guard !policy.allows(scratch.store) else { return nil }
      return
        "'\(scratch.store.rawValue)' is not among the administrator's allowed_stores (\((policy.allowedStores ?? []).map(\.rawValue).joined(separator: ", "))) ([policy] in \(policy.files.joined(separator: ", ")))"
    default: return nil
    }
  }

  mutating func apply(_ setting: ConfigLayer.Setting, from path: String) {
    try? config.set(setting.key, setting.value)
    sources[setting.key] = ConfigSource(path: path, line: setting.line)
  }

  /// The keys whose values differ from `other`'s, in the table's order.
  public func changedKeys(from other: EffectiveConfig) -> [BrokerConfig.Key] {
    BrokerConfig.Key.allCases.filter { config.value(of: $0) != other.config.value(of: $0) }
  }
}

extension ConfigFile.Value {
  /// The value as TOML writes it (strings in basic quotes, escaped as JSONText does).
  public var toml: String {
    switch self {
    // A JSON string literal is a TOML basic string: the same escapes (\uXXXX for the rest).
    case .string(let s): return JSONText.quote(s)
    case .integer(let n): return String(n)
    case .bool(let b): return b ? "true" : "false"
    case .array(let list): return "[" + list.map(\.toml).joined(separator: ", ") + "]"
    }
  }
}
