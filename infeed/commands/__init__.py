"""The ``infeed`` command (:mod:`infeed.commands.cli`) and one module per subcommand."""
