import sys

from dippm_nas.cli import main

sys.exit(main())
