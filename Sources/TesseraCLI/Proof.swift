import ArgumentParser
import TesseraClient
import TesseraInterface

/// `tessera proof`: the DPoP header for one request with a key-bound token (RFC 9449).
struct Proof: ParsableCommand {
  static let configuration = CommandConfiguration(
    commandName: "proof",
    abstract: "Print a DPoP proof for one request with a token bound to this machine.",
    discussion: """
      A token whose type is DPoP (`tessera token --json` says "token_type": "DPoP") is bound to a \
      key of this machine, which never leaves tesserad: every request it goes with needs a proof \
      of its own, in a DPoP header, and the token goes as `Authorization: DPoP TOKEN`. This \
      prints that header's value for the request --method and --url describe, for the token \
      `tessera token` with the same options prints (the two ask the broker for the same cached \
      token):

        url=https://api.example.com/me
        curl -H "Authorization: DPoP $(tessera token)" \\
             -H "DPoP: $(tessera proof --method GET --url "$url")" "$url"

      A resource that answers 401 with a DPoP-Nonce header wants that nonce in the proof: make \
      another with --nonce and send the request again. A bearer token needs no proof: this \
      exits with status \(ErrorCode.invalidArgument.exitCode) then. git, kubectl and mail \
      cannot send proofs; for a provider whose tokens go to them, set dpop = "off" \
      (tessera-config(5)).
      """)
  @OptionGroup var request: TokenTarget
  @Option(name: .long, help: ArgumentHelp("The request's HTTP method.", valueName: "method")) var method = "GET"
  @Option(name: .long, help: ArgumentHelp("The request's URL (https).", valueName: "url")) var url: String
  @Option(
    name: .long, help: ArgumentHelp("The DPoP-Nonce value the resource answered with.", valueName: "nonce"))
  var nonce: String?
  @OptionGroup var output: Output

  struct Answer: Encodable {
    var proof: String
    var tokenType: String
    var expiresOn: Int64

    enum CodingKeys: String, CodingKey {
      case proof
      case tokenType = "token_type"
      case expiresOn = "expires_on"
    }
  }

  func run() throws {
    let (token, proof) = try withBroker { broker throws(TesseraClientError) in
      let token = try request.token(broker: broker, interactive: false)
      return (token, try broker.proof(method: method, url: url, token: token.accessToken, nonce: nonce))
    }
    if output.json {
      printJSON(Answer(proof: proof, tokenType: token.tokenType, expiresOn: token.expiresOn))
    } else {
      print(proof)
    }
  }
}
