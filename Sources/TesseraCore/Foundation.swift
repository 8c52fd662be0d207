// The core uses only FoundationEssentials where it is available: it keeps the daemon small.
#if canImport(FoundationEssentials)
  @_exported import FoundationEssentials
#else
  @_exported import Foundation
#endif
