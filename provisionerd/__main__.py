import sys

from provisionerd.cli import main

sys.exit(main())
