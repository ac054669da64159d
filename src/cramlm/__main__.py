from cramlm.cli import main
from cramlm.launch import record_exit

try:
    main()
except SystemExit as e:  # click always ends this way; under `python -m cramlm.launch` the status is recorded
    record_exit(e.code)
    raise
