"""`python -m agentserve.cli`: the `agentserve` command without the installed script."""

from agentserve.cli import main

raise SystemExit(main())
