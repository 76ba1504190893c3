"""python -m evokube_operator: the same as the evokube-operator command."""

import sys

from evokube_operator.cli import main

sys.exit(main())
