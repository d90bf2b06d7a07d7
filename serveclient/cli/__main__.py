"""``python -m serveclient.cli``: the same as ``tsctl``."""

from serveclient.cli import main

raise SystemExit(main())
