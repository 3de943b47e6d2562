"""`python -m advisor`: the bottleneck advisor's command line (advisor.cli)."""

from advisor.cli import main

raise SystemExit(main())
