"""Entry point of ``python -m grader``; see ``grader._cli`` for the command line."""

from ._cli import main

raise SystemExit(main())
