"""CLI subcommands, one module each (discovered by tunescope.cli); ``options`` is their shared
CLI-only code. Modules import the library lazily inside ``run`` so that ``--help`` stays light."""
