"""`python -m convsweep`: the same as the `convsweep` command."""
from .cli import run

run()
