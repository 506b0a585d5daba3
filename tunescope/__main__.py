import sys

from tunescope.cli import main

sys.exit(main())
