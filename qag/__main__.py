"""`python -m qag`: the same as the `qag` command."""

from .cli import main

raise SystemExit(main())
