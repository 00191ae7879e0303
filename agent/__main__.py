"""`python -m agent`: run this node's engine agent (see `agent.main`)."""

import sys

from agent.main import main

sys.exit(main())
