"""`python -m convsweep`: the same as the `convsweep` command."""
import sys

from .cli import main

sys.exit(main())
