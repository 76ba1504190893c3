"""The `evokube` command and the tools behind it, run on a user's machine, never in a pod:
`cli.py` (the entry point), `local.py` (`evokube run`), `curves.py` (`evokube curve`). They
build on the layers below (runtime, policies); nothing below imports them."""
