"""``python -m kserve_tools.lint`` (``make kserve-lint``)."""

from kserve_tools.lint import main

raise SystemExit(main())
