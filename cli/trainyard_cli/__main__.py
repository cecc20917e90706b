import sys

from trainyard_cli.main import main

sys.exit(main())
