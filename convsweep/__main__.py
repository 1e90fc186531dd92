"""`python -m convsweep`: the same as the `convsweep` command."""
from convsweep.app.cli import run

run()
