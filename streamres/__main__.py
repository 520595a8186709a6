import sys

from streamres._apps.cli import main

sys.exit(main())
