import sys

from fastci.cli import main

sys.exit(main())
