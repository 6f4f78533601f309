"""``python -m infeed ...``: the same as the ``infeed`` command."""

import sys

from infeed.commands.cli import main

if __name__ == "__main__":
    sys.exit(main())
