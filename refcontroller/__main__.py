import sys

from refcontroller.cli import main

sys.exit(main())
