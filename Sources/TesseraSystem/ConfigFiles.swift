import Glibc
import SystemPackage
import TesseraInterface

/// Reads the configuration's files, for tesserad (at start and on SIGHUP) and for the CLI
/// (`tessera config`, `tessera git-credential`): the administrator's `/etc/tessera/config.toml`,
/// then `/etc/tessera/config.d/*.toml` in name order, then the user's config.toml (--config, else
/// $TESSERA_CONFIG, else $XDG_CONFIG_HOME/tessera/config.toml). Every file is checked whole, and
/// any problem in any of them refuses the whole configuration (EffectiveConfig says how they
/// combine).
public enum ConfigFiles {
  /// The outcome of a reading: the configuration in force, or every problem found.
  public enum Reading: Sendable {
    case loaded(EffectiveConfig)
    case problems([ConfigProblem])
  }

  /// The administrator's files in `directory`, in the order they are read: config.toml (when it
  /// exists), then config.d's regular `*.toml` files (not hidden ones) sorted by their bytes, as
  /// systemd sorts drop-ins. A directory that cannot be listed for another reason than its absence
  /// is a problem.
  public static func systemPaths(directory: String) -> ([String], [ConfigProblem]) {
    var paths: [String] = []
    var problems: [ConfigProblem] = []
    let main = directory + "/config.toml"
    if access(main, F_OK) == 0 { paths.append(main) }
    let dropIns = directory + "/config.d"
    guard let dir = opendir(dropIns) else {
      let code = errno
      if code != ENOENT && code != ENOTDIR {
        problems.append(
          ConfigProblem(
            path: dropIns, line: nil, reason: "cannot be listed: \(Errno(rawValue: code)); an administrator can fix it")
        )
      }
      return (paths, problems)
    }
    defer { closedir(dir) }
    var names: [String] = []
    while let entry = readdir(dir) {
      let name = Files.name(of: entry)
      guard name.hasSuffix(".toml"), !name.hasPrefix(".") else { continue }
      var info = stat()
      // A drop-in that cannot be read (a dangling link, a directory) is a problem to say: a
      // policy must not vanish without a word.
      let path = dropIns + "/" + name
      guard stat(path, &info) == 0 else {
        let code = errno
        problems.append(
          ConfigProblem(
            path: dropIns + "/" + name, line: nil,
            reason: "cannot be read: \(Errno(rawValue: code)); an administrator can fix or remove it"))
        continue
      }
      guard info.st_mode & S_IFMT == S_IFREG else {
        problems.append(
          ConfigProblem(
            path: dropIns + "/" + name, line: nil,
            reason: "is not a regular file; an administrator can replace or remove it"))
        continue
      }
      names.append(name)
    }
    paths += names.sorted { Array($0.utf8).lexicographicallyPrecedes(Array($1.utf8)) }.map { dropIns + "/" + $0 }
    return (paths, problems)
  }

  /// Reads and combines every file. `option` is --config's value.
  public static func load(option: String?, environment: [String: String]) -> Reading {
    let (systemFiles, listing) = systemPaths(directory: ConfigLocation.systemDirectory(environment: environment))
    var problems = listing
    var system: [ConfigLayer] = []
    for path in systemFiles {
      switch read(path, isSystem: true, mustExist: true) {
      case .success(let layer?): system.append(layer)
      case .success(nil): break
      case .failure(let found): problems += found.problems
      }
    }
    let userPath = ConfigLocation.path(option: option, environment: environment)
    var user: ConfigLayer?
    switch read(
      userPath, isSystem: false, mustExist: ConfigLocation.isNamed(option: option, environment: environment))
    {
    case .success(let layer): user = layer
    case .failure(let found): problems += found.problems
    }
    guard problems.isEmpty else { return .problems(problems) }
    let effective: EffectiveConfig
    do {
      effective = try EffectiveConfig.combine(system: system, user: user)
    } catch {
      return .problems(error.problems)
    }
    let secrets = effective.config.providers.compactMap(secretFileProblem)
    return secrets.isEmpty ? .loaded(effective) : .problems(secrets)
  }

  /// Why a provider's client_secret_file cannot be used, or nil: it must be a regular file of the
  /// user's that no one else can read, in a directory no one else can write (the administrator's
  /// providers: root's or the user's, that no one else can write, as config.toml itself).
  static func secretFileProblem(_ provider: ProviderConfig) -> ConfigProblem? {
    guard let path = provider.clientSecretFile else { return nil }
    let advice: String
    do {
      try CheckedFile.inspect(path, rules: provider.fromAdministrator ? .sharedSecret : .secret)
      return nil
    } catch {
      switch error {
      case .system(.noSuchFileOrDirectory):
        advice = "does not exist; write the client secret there (`tessera provider add` does), or fix the path"
      case .system(let code): advice = "cannot be read: \(String(cString: strerror(code.rawValue)))"
      case .mode where provider.fromAdministrator:
        advice = "\(error): a client secret no one else may change; run `chmod go-w \(path)`"
      case .mode:
        advice = "\(error): a client secret must be yours alone; run `chmod 600 \(path)`"
      case .owner: advice = "\(error): a client secret must be yours alone; `chown` it to yourself and `chmod 600` it"
      case .notRegular: advice = "\(error); make it a regular file with the secret in it"
      case .directoryOwner(let directory, _), .directoryMode(let directory, _):
        advice = "\(error), who could replace it; keep it in a directory only you can write (`chmod go-w \(directory)`)"
      }
    }
    return ConfigProblem(
      path: provider.file, line: provider.clientSecretFileLine, key: "client_secret_file",
      kind: .inTable("provider"), reason: "\(path) \(advice)")
  }

  /// One file, checked; nil when it does not exist and need not.
  static func read(_ path: String, isSystem: Bool, mustExist: Bool) -> Result<ConfigLayer?, ConfigProblems> {
    func problem(_ reason: String) -> Result<ConfigLayer?, ConfigProblems> {
      .failure(ConfigProblems([ConfigProblem(path: path, line: nil, reason: reason)]))
    }
    // Read through the descriptor that was checked: the `browser` key runs a program, and the
    // trust settings decide where refresh tokens go, so another user who could write the file
    // (or swap it, or link it into a directory of theirs) could make the daemon do either.
    let bytes: [UInt8]
    do {
      bytes = try CheckedFile.read(path, limit: BrokerConfig.maxFileBytes, rules: .configuration)
    } catch {
      let owner = isSystem ? "root" : "yourself"
      switch error {
      case .system(.noSuchFileOrDirectory) where !mustExist:
        return .success(nil)
      // Over the limit is a mistake to say, not a file to ignore (files are refused, never cut).
      case .system(.fileTooLarge):
        return problem(
          "is larger than \(BrokerConfig.maxFileBytes >> 20) MiB, and is refused"
            + (isSystem ? "; an administrator can fix it" : "; point --config at the right file"))
      case .system(let code):
        return problem(
          "cannot be read: \(String(cString: strerror(code.rawValue)))"
            + (mustExist && !isSystem ? "; check the path" : ""))
      case .notRegular:
        return problem("\(error), and is refused; make it a regular file" + (isSystem ? " (as root)" : ""))
      case .owner, .mode:
        return problem(
          "\(error), and its 'browser' key runs a program as you. Run `chmod go-w` on it"
            + (isSystem ? " as root" : " (and `chown` it to yourself)"))
      case .directoryOwner(let directory, _), .directoryMode(let directory, _):
        return problem(
          "\(error), who could replace it, and its 'browser' key runs a program as you. "
            + "Keep it in a directory only you or root can write (`chmod go-w \(directory)`, `chown` it to \(owner)), or move it"
        )
      }
    }
    do {
      return .success(try ConfigLayer.parse(bytes: bytes, path: path, isSystem: isSystem))
    } catch {
      return .failure(error)
    }
  }
}
