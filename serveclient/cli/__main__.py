"""``python -m tsclient.cli``: the same as ``tsctl``."""

from tsclient.cli import main

raise SystemExit(main())
