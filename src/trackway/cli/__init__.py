"""The command line: one module per command group, thin over the packages."""
