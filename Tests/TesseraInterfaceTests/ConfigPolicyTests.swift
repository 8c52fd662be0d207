import XCTest

@testable import TesseraInterface

/// The administrator's files and the user's, combined under `[policy]` (issue 26).
final class ConfigPolicyTests: XCTestCase {
  func system(_ text: String, _ path: String = "/etc/tessera/config.toml") throws -> ConfigLayer {
    try ConfigLayer.parse(bytes: Array(text.utf8), path: path, isSystem: true)
  }

  func user(_ text: String) throws -> ConfigLayer {
    try ConfigLayer.parse(bytes: Array(text.utf8), path: "/home/ann/.config/tessera/config.toml", isSystem: false)
  }

  func problems(_ body: () throws -> Any) -> [String] {
    do {
      _ = try body()
      XCTFail("expected problems")
      return []
    } catch let error as ConfigProblems {
      return error.problems.map(\.description)
    } catch {
      XCTFail("\(error)")
      return []
    }
  }

  func testALaterFileReplacesAnEarlierOnesKeyAndEachKeyKnowsItsFile() throws {
    let effective = try EffectiveConfig.combine(
      system: [
        try system("log_level = \"notice\"\ndefault_client_id = \"site\"\n"),
        try system("log_level = \"warning\"\n", "/etc/tessera/config.d/10-site.toml"),
      ],
      user: try user("\n\nlog_level = \"debug\"\n"))
    XCTAssertEqual(effective.config.logLevel, "debug")
    XCTAssertEqual(effective.config.defaultClientID, "site")
    XCTAssertEqual(effective.sources[.logLevel]?.description, "/home/ann/.config/tessera/config.toml:3")
    XCTAssertEqual(effective.sources[.defaultClientID]?.description, "/etc/tessera/config.toml:2")
    XCTAssertNil(effective.sources[.store])
    XCTAssertEqual(
      effective.files,
      ["/etc/tessera/config.toml", "/etc/tessera/config.d/10-site.toml", "/home/ann/.config/tessera/config.toml"])
    XCTAssertEqual(effective.warnings, [])
  }

  func testALockedKeyTheUserChangesIsIgnoredWithOneWarningNamingBothFiles() throws {
    let admin = try system(
      """
      trusted_authorities = ["https://idp.example.com/"]
      [policy]
      locked = ["trusted_authorities", "ca_file"]
      """)
    let effective = try EffectiveConfig.combine(
      system: [admin],
      user: try user("trusted_authorities = [\"https://evil.example.com/\"]\nca_file = \"/tmp/ca.pem\"\n"))
    XCTAssertEqual(effective.config.trustedAuthorities, ["https://idp.example.com/"])
    XCTAssertNil(effective.config.caFile)
    XCTAssertEqual(effective.warnings.count, 2)
    XCTAssertTrue(
      effective.warnings[0].hasPrefix("/home/ann/.config/tessera/config.toml:1: key 'trusted_authorities' is locked"))
    XCTAssertTrue(effective.warnings[0].contains("the administrator's value (/etc/tessera/config.toml:1) stays"))
    XCTAssertEqual(effective.sources[.trustedAuthorities]?.line, 1)
    // Writing the value in force is no override: no warning.
    let same = try EffectiveConfig.combine(
      system: [admin], user: try user("trusted_authorities = [\"https://idp.example.com/\"]\n"))
    XCTAssertEqual(same.warnings, [])
  }

  func testTheMinimumAccessModeRaisesTheDefaultAndIgnoresALooserOneButNotAStricter() throws {
    let admin = try system("[policy]\nminimum_access_mode = \"strict\"\n")
    XCTAssertEqual(try EffectiveConfig.combine(system: [admin], user: nil).config.accessMode, .strict)
    let looser = try EffectiveConfig.combine(system: [admin], user: try user("access_mode = \"open\"\n"))
    XCTAssertEqual(looser.config.accessMode, .strict)
    XCTAssertEqual(looser.warnings.count, 1)
    XCTAssertTrue(looser.warnings[0].contains("'open' is below the administrator's minimum_access_mode 'strict'"))
    let confirm = try system("[policy]\nminimum_access_mode = \"confirm\"\n")
    let stricter = try EffectiveConfig.combine(system: [confirm], user: try user("access_mode = \"strict\"\n"))
    XCTAssertEqual(stricter.config.accessMode, .strict)
    XCTAssertEqual(stricter.warnings, [])
  }

  func testAStoreThePolicyDoesNotAllowIsIgnoredForAUserAndRefusedForTheAdministrator() throws {
    let admin = try system("[policy]\nallowed_stores = [\"secret-service\"]\n")
    let effective = try EffectiveConfig.combine(system: [admin], user: try user("store = \"file\"\n"))
    XCTAssertEqual(effective.config.store, .auto)
    XCTAssertTrue(
      effective.warnings[0].contains("'file' is not among the administrator's allowed_stores (secret-service)"))
    XCTAssertFalse(effective.policy.allows(.file))
    XCTAssertTrue(effective.policy.allows(.auto))
    let found = problems {
      try EffectiveConfig.combine(
        system: [
          try system(
            "store = \"memory\"\naccess_mode = \"open\"\n[policy]\nallowed_stores = [\"file\"]\nminimum_access_mode = \"confirm\"\n"
          )
        ],
        user: nil)
    }
    XCTAssertEqual(found.count, 2)
    XCTAssertTrue(found[0].hasPrefix("/etc/tessera/config.toml:1: key 'store': 'memory' is not among"))
    XCTAssertTrue(found[1].hasPrefix("/etc/tessera/config.toml:2: key 'access_mode': 'open' is below"))
  }

  func testPoliciesOfSeveralFilesAddUpTheStrictestWinning() throws {
    let effective = try EffectiveConfig.combine(
      system: [
        try system(
          "[policy]\nlocked = [\"ca_file\"]\nminimum_access_mode = \"strict\"\nallowed_stores = [\"file\", \"memory\"]\n"
        ),
        try system(
          "[policy]\nlocked = [\"browser\"]\nminimum_access_mode = \"confirm\"\nallow_forwarding = false\nallowed_stores = [\"memory\", \"secret-service\"]\n",
          "/etc/tessera/config.d/a.toml"),
      ], user: nil)
    XCTAssertEqual(effective.policy.locked, [.caFile, .browser])
    XCTAssertEqual(effective.policy.minimumAccessMode, .strict)
    XCTAssertFalse(effective.policy.allowForwarding)
    XCTAssertEqual(effective.policy.allowedStores, [.memory])
    XCTAssertEqual(effective.policy.files, ["/etc/tessera/config.toml", "/etc/tessera/config.d/a.toml"])
  }

  func testPolicyMistakesAreErrorsWithTheirLines() {
    let found = problems {
      try self.system(
        """
        [policy]
        lockd = ["ca_file"]
        locked = ["trusted_authority"]
        minimum_access_mode = "lax"
        allow_forwarding = "no"
        allowed_stores = ["auto"]
        """)
    }
    XCTAssertEqual(
      found,
      [
        "/etc/tessera/config.toml:2: [policy] key 'lockd': unknown key; did you mean 'locked'?",
        "/etc/tessera/config.toml:3: [policy] key 'locked': 'trusted_authority' is not a setting; known keys are default_authority, default_client_id, default_scopes, trusted_authorities, ca_file, ca_file_for_microsoft, browser, redirect_port, allow_insecure_loopback, log_level, client_capabilities, microsoft_broker, access_mode, notify_first_use, store, dpop",
        "/etc/tessera/config.toml:4: [policy] key 'minimum_access_mode': must be one of open, confirm, strict",
        "/etc/tessera/config.toml:5: [policy] key 'allow_forwarding': must be true or false",
        "/etc/tessera/config.toml:6: [policy] key 'allowed_stores': 'auto' is not a store; the stores are secret-service, file, memory",
      ])
  }

  func testAUsersFileCannotHoldAPolicyAndTablesAreWrittenTheTOMLWay() {
    XCTAssertEqual(
      problems { try self.user("log_level = \"info\"\n[policy]\nlocked = []\n") },
      [
        "/home/ann/.config/tessera/config.toml:2: table [policy]: is read only from the administrator's files (/etc/tessera/config.toml and config.d/*.toml), never from a user's; remove it from this file"
      ])
    XCTAssertEqual(
      problems { try self.system("[git]\nurl = \"h\"\n") },
      ["/etc/tessera/config.toml:1: table [git]: write [[git]]: each entry is a [[git]] of its own"])
    XCTAssertEqual(
      problems { try self.system("[[policy]]\n") },
      ["/etc/tessera/config.toml:1: table [[policy]]: write [policy]: it is one table, not a list of entries"])
    XCTAssertEqual(
      problems { try self.system("[polcy]\n") },
      ["/etc/tessera/config.toml:1: table [polcy]: unknown table; did you mean [policy]?"])
    // TOML: one [name] table per file, and a name is a table or an array of tables, not both.
    XCTAssertEqual(
      problems { try self.system("[policy]\n[policy]\n") },
      ["/etc/tessera/config.toml:2: the table [policy] is already written on line 1; keep one"])
    XCTAssertThrowsError(try ConfigFile(parsing: "[[policy]]\n[policy]\n"))
  }

  func testEveryValueWrittenAsTOMLReadsBackTheSame() throws {
    let values: [ConfigFile.Value] = [
      .string("plain"), .string("quote \" back\\slash\ttab\nnewline \u{7F} \u{1} é ☃"), .integer(-42), .bool(true),
      .array([.string("a"), .integer(1), .array([])]),
    ]
    for value in values {
      let file = try ConfigFile(parsing: "k = \(value.toml)\n")
      XCTAssertEqual(file.entries.first?.value, value, value.toml)
    }
  }

  func testStoresNoPolicyAgreesOnAndSettingsWrittenUnderPolicyAreErrorsThatSayWhy() throws {
    let found = problems {
      try EffectiveConfig.combine(
        system: [
          try system("[policy]\nallowed_stores = [\"file\"]\n"),
          try system("[policy]\nallowed_stores = [\"secret-service\"]\n", "/etc/tessera/config.d/b.toml"),
        ], user: nil)
    }
    XCTAssertEqual(found.count, 1)
    XCTAssertTrue(found[0].contains("have no store in common"), found[0])
    XCTAssertEqual(
      problems { try self.system("[policy]\nlocked = []\ntrusted_authorities = []\n") },
      [
        "/etc/tessera/config.toml:3: [policy] key 'trusted_authorities': is a setting, not a policy key: in TOML every key after the [policy] header belongs to that table, so write settings above [policy]"
      ])
  }

  func testAnAccessModeTheMinimumRaisedNamesThePolicyAsItsSource() throws {
    let effective = try EffectiveConfig.combine(
      system: [try system("[policy]\nminimum_access_mode = \"strict\"\n", "/etc/tessera/config.d/sec.toml")],
      user: try user("log_level = \"debug\"\n"))
    XCTAssertEqual(
      effective.sources[.accessMode]?.description, "/etc/tessera/config.d/sec.toml ([policy] minimum_access_mode)")
  }
}
