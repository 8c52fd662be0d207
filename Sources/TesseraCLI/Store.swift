import ArgumentParser
import TesseraClient
import TesseraInterface
import TesseraSystem

extension Tessera {
  struct Store: ParsableCommand {
    static let configuration = CommandConfiguration(
      commandName: "store",
      abstract: "Where tesserad keeps accounts and tokens: move them to another store.",
      subcommands: [Migrate.self])

    struct Migrate: ParsableCommand {
      static let configuration = CommandConfiguration(
        commandName: "migrate",
        abstract: "Move every account, token and grant to another store, and use it from now on.",
        discussion: """
          Moves everything tesserad keeps (accounts, refresh and access tokens, grants, use \
          records) from the store in use to the file store (sealed files under \
          $XDG_STATE_HOME/tessera/store) or to the Secret Service (the desktop keyring), and \
          makes tesserad use that store at once: tokens keep coming silently, with no new \
          sign-in. Safe to interrupt at any point: nothing is lost and nothing doubled, and \
          tesserad finishes an interrupted move when it starts again.

          config.toml's `store` must be "auto" or the store you move to (otherwise the next \
          start would open the other one); the target must be usable (an unlocked keyring) and \
          hold none of Tessera's items yet. `tessera status` shows the store in use.

          Examples:
            tessera store migrate --to file
            tessera store migrate --to secret-service
          """)
      @Option(
        name: .long,
        help: ArgumentHelp("The store to move to: file or secret-service.", valueName: "store"))
      var to: String
      @OptionGroup var output: Output

      func validate() throws {
        guard ["file", "secret-service"].contains(to) else {
          throw ValidationError("--to takes file or secret-service, not '\(SafeText.clip(to, limit: 64))'.")
        }
      }

      func run() throws {
        let moved = try withBroker { broker throws(TesseraClientError) in try broker.moveStore(to: to) }
        if output.json { return printJSON(moved) }
        print(
          "Moved \(moved.items) item\(moved.items == 1 ? "" : "s") from the \(moved.from) store to the \(moved.to) store; tesserad uses the \(moved.to) store now."
        )
      }
    }
  }
}
