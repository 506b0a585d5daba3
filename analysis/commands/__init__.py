"""CLI subcommands, one module each (discovered by analysis.cli)."""
