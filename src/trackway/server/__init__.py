"""The REST API (and, later, the dashboard) over one ledger: `trackway serve`."""
