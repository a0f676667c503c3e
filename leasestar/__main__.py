"""`python -m leasestar`: the same command as `leasestar`."""

import sys

from leasestar.cli import main

sys.exit(main())
