import TesseraInterface

/// The daemon's configuration is `BrokerConfig` (TesseraInterface/BrokerConfig.swift): config.toml
/// checked by the one check tesserad and the CLI share. What only the engine derives from it:
extension BrokerConfig {
  public var authorityPolicy: AuthorityPolicy {
    // A provider in config.toml is trusted as its issuer: the user named it there.
    AuthorityPolicy(
      trusted: (trustedAuthorities + providers.map(\.issuer)).compactMap { try? Authority(parsing: $0) },
      allowInsecureLoopback: allowInsecureLoopback)
  }
}
