import sys

from trainyard_cli.cli import main

sys.exit(main())
