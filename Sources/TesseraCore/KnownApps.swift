/// Friendly names for well-known public client ids, for what the user reads (notifications);
/// anything else is shown by its client id.
public enum KnownApps {
  static let names: [String: String] = [
    "04b07795-8ddb-461a-bbee-02f9e1bf7b46": "Azure CLI",
    "1950a258-227b-4e31-a9cf-717495945fc2": "Azure PowerShell",
    "aebc6443-996d-45c2-90f0-388ff96faa56": "Visual Studio Code",
    "872cd9fa-d31f-45e0-9eab-6e460a02d1f1": "Visual Studio (and Git Credential Manager)",
    "1fec8e78-bce4-4aaf-ab1b-5451cc387264": "Microsoft Teams",
    "d3590ed6-52b3-4102-aeff-aad2292ab01c": "Microsoft Office",
  ]

  public static func name(of clientID: String) -> String { names[clientID.lowercased()] ?? "The app \(clientID)" }
}
