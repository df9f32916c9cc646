"""One module per `extforge` subcommand; see extforge.cli for the contract."""
