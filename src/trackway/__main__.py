"""`python -m trackway` runs the CLI."""

from trackway.cli.main import main

main()
