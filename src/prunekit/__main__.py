"""``python -m prunekit``: the command line."""

from prunekit.cli import main

raise SystemExit(main())
