"""``python -m voxstage ...`` runs the same CLI as the ``voxstage`` console script."""

import sys

from voxstage.cli import main

if __name__ == "__main__":
    sys.exit(main())
