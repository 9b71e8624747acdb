"""``python -m prunekit``: the command line."""

from prunekit.tools.cli import main

raise SystemExit(main())
