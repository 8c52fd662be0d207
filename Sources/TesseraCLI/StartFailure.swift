import TesseraClient

/// Placeholder until the configuration diagnosis lands (issue 22, point 1): no diagnosis.
func startFailure(_ error: TesseraClientError) -> (message: String, status: Int32)? { nil }
