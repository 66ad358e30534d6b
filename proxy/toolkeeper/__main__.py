import sys

from toolkeeper.cli import main

sys.exit(main())
