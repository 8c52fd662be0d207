// What both sides of the bus share: values, the interface, the error and option tables.
@_exported import TesseraInterface

// The core uses only FoundationEssentials where it is available: it keeps the daemon small.
#if canImport(FoundationEssentials)
  @_exported import FoundationEssentials
#else
  @_exported import Foundation
#endif
