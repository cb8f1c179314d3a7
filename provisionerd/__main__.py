import sys

from provisionerd.cli.main import main

sys.exit(main())
